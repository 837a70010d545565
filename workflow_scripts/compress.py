import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake)
from anetts.compile.compress import compress_and_gate
from anetts.verify.parity import Gate

inp, out, p = snakemake.input, snakemake.output, snakemake.params
try:
    compress_and_gate(snakemake.wildcards.stage, inp.base_package, inp.base_report,
                      inp.example_inputs, inp.export_outputs, inp.export_report, dict(p.settings), Gate.make(**p.gate),
                      out.package, out.report, out.parity, snakemake.wildcards.variant, compute_units=p.compute_units,
                      default_gate=Gate.make(**p.default_gate))
except Exception as e:
    log.error("%s", e)  # the measured dB in the job's own log, not only in Snakemake's output
    raise
