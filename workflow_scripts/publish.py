import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake)
from pathlib import Path

from anetts.publish import publish

target = dict(snakemake.params.target)
publish(Path(snakemake.input.manifest).parent, target["repo_id"], revision=target["revision"],
        private=target["private"], echo=log.info)
