import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake)
from anetts.compile.variants_report import write_variant_manifest

inp, p = snakemake.input, snakemake.params
write_variant_manifest(snakemake.output[0], snakemake.wildcards.variant, inp.weights, inp.reports, inp.packages,
                       inp.torchscripts, inp.scenarios, inp.parity, dict(p.model_meta), dict(p.stages), dict(p.compressed),
                       assets_dir=inp.assets, chain=inp.chain)
