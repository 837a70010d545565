import sys
from pathlib import Path

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake, coremltools=True, huge_pages=True)  # the Fish check decodes with the reference model
from anetts.verify.end_to_end import check_end_to_end_report

inp = snakemake.input
out = Path(snakemake.output[0])
manifest_inputs = dict(weights_dir=inp.weights, reports=inp.reports, packages=inp.packages,
                       torchscripts=inp.torchscripts, scenarios=inp.scenarios, parity=inp.parity,
                       model_meta=dict(snakemake.params.model_meta), stages=dict(snakemake.params.stages),
                       assets_dir=inp.assets)
check_end_to_end_report(out, out.parent, manifest_inputs, dict(snakemake.params.settings), dict(snakemake.params.gate))
