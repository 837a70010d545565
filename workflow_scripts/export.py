import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake)
from anetts.families import get_family

inp, out, p = snakemake.input, snakemake.output, snakemake.params
family, stage, reference = get_family(p.family), snakemake.wildcards.stage, (inp.reference[0] if inp.reference else None)
if "scenario" in out.keys():  # rule export_scenario: every function traced, the scenario recorded
    from anetts.compile.scenario_export import export_scenario_stage

    export_scenario_stage(family, stage, snakemake.wildcards.bucket, p.size, dict(p.stage), inp.weights, reference,
                          out.traced, out.scenario, out.report)
else:
    from anetts.compile.trace import export_stage

    export_stage(family, stage, p.size, inp.weights, out.traced, out.example_inputs, out.report, out.export_outputs,
                 reference=reference)
