import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake)
from anetts.compile.scenario_export import export_scenario_stage
from anetts.families import get_family

out = snakemake.output
export_scenario_stage(get_family(snakemake.params.family), snakemake.wildcards.stage, snakemake.wildcards.bucket,
                      snakemake.params.size, dict(snakemake.params.stage), snakemake.input.weights,
                      snakemake.input.reference[0], out.functions, out.scenario, out.report)
