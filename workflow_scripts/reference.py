import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake, huge_pages=True)
from anetts.compile.reference import write_reference
from anetts.families import get_family

write_reference(get_family(snakemake.params.family), snakemake.params.size, snakemake.input.weights, snakemake.output[0],
                **dict(snakemake.params.run))
