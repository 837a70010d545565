import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake)
from anetts.compile.aimodel import convert_stage
from anetts.families import get_family

inp, out = snakemake.input, snakemake.output
convert_stage(get_family(snakemake.params.family), snakemake.wildcards.stage, snakemake.params.size, inp.weights,
              inp.scenario, inp.export_report, out.asset, out.report,
              snakemake.params.precision, dict(snakemake.params.model_meta), params=dict(snakemake.params.stage))
