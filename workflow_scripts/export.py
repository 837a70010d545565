import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake)
from anetts.compile.export import export_stage
from anetts.families import get_family

inp, out, p = snakemake.input, snakemake.output, snakemake.params
export_stage(get_family(p.family), snakemake.wildcards.stage, snakemake.wildcards.bucket, p.size, dict(p.stage),
              inp.weights, inp.reference[0] if inp.reference else None, out.functions, out.scenario, out.report)
