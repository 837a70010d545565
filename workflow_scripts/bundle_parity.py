import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake)
from anetts.families import get_family
from anetts.verify.parity import Gate, check_bundle_parity

inp = snakemake.input
check_bundle_parity(get_family(snakemake.params.family), snakemake.wildcards.stage, dict(snakemake.params.sizes),
                    inp.bundle, list(inp.example_inputs), list(inp.reference_arrays), Gate(**snakemake.params.gate),
                    snakemake.output[0])
