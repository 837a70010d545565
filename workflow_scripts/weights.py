import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake)
from anetts.weights import materialize_weights

record = materialize_weights(snakemake.params.family, dict(snakemake.params.source), snakemake.output[0])
log.info("weights ready: %s", {k: record[k] for k in ("family", "source", "voices")})
