import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake)
from anetts.families import get_family
from anetts.verify.parity import Gate, check_bundle_parity

family = get_family(snakemake.params.family)
check_bundle_parity(family, snakemake.wildcards.stage, dict(snakemake.params.sizes), snakemake.input.weights,
                    snakemake.input.bundle, list(snakemake.input.torchscripts), Gate(**snakemake.params.gate),
                    snakemake.output[0], compute_units=snakemake.params.compute_units)
