import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake, coremltools=True)
from anetts.verify.parity import Gate, check_parity, run_parity

inp = snakemake.input
report = run_parity(inp.package, inp.example_inputs, inp.export_outputs, inp.export_report, Gate.make(**snakemake.params.gate),
                    compute_units=snakemake.params.compute_units)
check_parity(report, snakemake.output.report, snakemake.output.arrays)
