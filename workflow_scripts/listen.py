import sys
from pathlib import Path

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake, coremltools=True)
from anetts.listen.build import check_listen_report

inp, out = snakemake.input, snakemake.output
manifest_inputs = dict(weights_dir=inp.weights, reports=inp.reports, packages=inp.packages,
                       torchscripts=inp.torchscripts, scenarios=inp.scenarios, parity=inp.parity,
                       model_meta=dict(snakemake.params.model_meta), stages=dict(snakemake.params.stages),
                       assets_dir=inp.assets)
check_listen_report(Path(out.report), Path(out.clips), manifest_inputs, dict(snakemake.params.settings))
