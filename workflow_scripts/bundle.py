import sys
from pathlib import Path

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake, coremltools=True)
from anetts.artifacts import atomic_outputs, write_json
from anetts.compile.bundle import bundle_packages, function_name

buckets = list(snakemake.params.buckets)
report = bundle_packages({function_name(b): Path(p) for b, p in zip(buckets, snakemake.input.packages)},
                         Path(snakemake.output.package), default_function=function_name(buckets[0]))
report["buckets"] = {function_name(b): b for b in buckets}
with atomic_outputs(snakemake.output.report) as (tmp,):
    write_json(tmp, report)
