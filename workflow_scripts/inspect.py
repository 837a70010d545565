import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake)
from anetts.artifacts import atomic_outputs, write_json
from anetts.build.inspect import inspect_package

with atomic_outputs(snakemake.output[0]) as (tmp,):
    write_json(tmp, inspect_package(snakemake.input.package))
