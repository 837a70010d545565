import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake, coremltools=True)
from anetts.options import Gate
from anetts.verify.parity import check_parity, run_parity

inp, p = snakemake.input, snakemake.params
report = run_parity(inp.package, inp.scenario, inp.export_report, Gate.make(**p.gate), compute_units=p.compute_units)
check_parity(report, snakemake.output.report, snakemake.output.arrays)
