import json
import sys
from pathlib import Path

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake, coremltools=True)
from anetts.compile.compress import compress_and_gate
from anetts.options import Gate
from anetts.verify.parity import run_parity

inp, out, p = snakemake.input, snakemake.output, snakemake.params
gate = Gate.make(**p.gate)
# weights the stage keeps at its precision in every variant (Stage.uncompressed_weights)
uncompressed = json.loads(Path(inp.export_report).read_text(encoding="utf-8"))["uncompressed_weights"]


def score(package):
    return run_parity(package, inp.scenario, inp.export_report, gate, compute_units=p.compute_units)


try:
    compress_and_gate(snakemake.wildcards.stage, inp.base_package, inp.base_report, dict(p.settings), gate, score,
                      out.package, out.report, out.parity, snakemake.wildcards.variant,
                      default_gate=Gate.make(**p.default_gate), uncompressed=uncompressed)
except Exception as e:
    log.error("%s", e)  # the measured numbers in the job's own log, not only in Snakemake's output
    raise
