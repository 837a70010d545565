import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake)
from anetts.compile.variants_report import write_variants_summary

write_variants_summary(snakemake.input.reports, snakemake.input.base_parity, snakemake.output.json,
                       snakemake.output.markdown)
