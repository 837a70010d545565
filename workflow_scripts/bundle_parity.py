import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake, coremltools=True)
from anetts.options import Gate
from anetts.verify.parity import check_bundle_parity

inp = snakemake.input
check_bundle_parity(snakemake.wildcards.stage, list(snakemake.params.buckets), inp.bundle, list(inp.packages),
                    list(inp.export_reports), list(inp.scenarios), list(inp.parity_arrays),
                    Gate.make(**snakemake.params.gate), snakemake.output[0])
