import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake, torch=False)
from anetts.verify.summary import write_summary

out = snakemake.output
write_summary(snakemake.params.model, snakemake.input.reports, snakemake.input.arrays, dict(snakemake.params.audio),
              out.markdown, out.json, out.snr_plot, out.waveform_plot)
