import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake, torch=False)
from anetts.report import build_report
from anetts.report.inputs import KEYS

inputs = {k: list(getattr(snakemake.input, k)) for k in KEYS if hasattr(snakemake.input, k)}
out = build_report(inputs, snakemake.output[0])
log.info("wrote %s", out)
