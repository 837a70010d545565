import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake, coremltools=True)
from anetts.options import Gate

inp, p = snakemake.input, snakemake.params
gate = Gate.make(**p.gate)
if "scenario" in inp.keys():  # a scenario stage: the package plays its teacher-forced calls
    from anetts.verify.scenario_parity import check_scenario_parity, run_scenario_parity

    report = run_scenario_parity(inp.package, inp.scenario, inp.export_report, gate, compute_units=p.compute_units)
    check_scenario_parity(report, snakemake.output.report, snakemake.output.arrays)
else:
    from anetts.verify.parity import check_parity, run_parity

    report = run_parity(inp.package, inp.example_inputs, inp.export_outputs, inp.export_report, gate,
                        compute_units=p.compute_units)
    check_parity(report, snakemake.output.report, snakemake.output.arrays)
