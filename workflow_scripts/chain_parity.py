import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake, coremltools=True)
from anetts.verify.chain_gate import check_chain_report

check_chain_report(snakemake.params.family, dict(zip(snakemake.params.stages, snakemake.input.packages)),
                   snakemake.input.assets, snakemake.input.reference, dict(snakemake.params.gate),
                   dict(snakemake.params.stage_params), dict(snakemake.params.settings), snakemake.output[0])
