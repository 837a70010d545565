import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake)
from anetts.compile.trace import export_stage
from anetts.families import get_family

out = snakemake.output
export_stage(get_family(snakemake.params.family), snakemake.wildcards.stage, snakemake.params.size,
             snakemake.input.weights, out.torchscript, out.example_inputs, out.report, out.outputs,
             reference=snakemake.input.reference[0] if snakemake.input.reference else None)
