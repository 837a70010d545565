import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake)
from anetts.compile.assets import write_assets

written = write_assets(snakemake.params.family, snakemake.input.weights, snakemake.output[0])
log.info("wrote %d runtime assets", len(written))
