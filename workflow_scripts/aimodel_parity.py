import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake, coremltools=True)
from anetts.verify.aimodel_parity import run_aimodel_parity
from anetts.options import Gate
from anetts.verify.parity import check_parity

inp = snakemake.input
report = run_aimodel_parity(inp.asset, inp.scenario, inp.export_report,
                            Gate(**snakemake.params.gate), asset_report=inp.asset_report)
check_parity(report, snakemake.output.report, snakemake.output.arrays)
