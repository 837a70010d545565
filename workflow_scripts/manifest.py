import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake)
from anetts.compile.manifest import write_manifest

inp = snakemake.input
write_manifest(snakemake.output[0], inp.weights, inp.reports, inp.packages, inp.torchscripts, inp.scenarios, inp.parity,
               dict(snakemake.params.model_meta), dict(snakemake.params.stages),
               bundles=inp.bundles, bundle_parity=inp.bundle_parity, assets_dir=inp.assets,
               chain=inp.chain, end_to_end=inp.end_to_end, listen=inp.listen)
