import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake, coremltools=True)
from anetts.options import Gate
from anetts.verify.scenario_parity import check_scenario_parity, run_scenario_parity

inp = snakemake.input
report = run_scenario_parity(inp.package, inp.scenario, inp.export_report, Gate.make(**snakemake.params.gate),
                             compute_units=snakemake.params.compute_units)
check_scenario_parity(report, snakemake.output.report, snakemake.output.arrays)
