import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake)
from anetts.compile.variants_report import write_variants_summary

inp, p = snakemake.input, snakemake.params
write_variants_summary(inp.reports, inp.base_parity, snakemake.output.json, snakemake.output.markdown,
                       variants=dict(p.variants), family=p.family, weights_dir=inp.weights,
                       base={"reports": list(inp.base_reports), "packages": list(inp.base_packages)})
