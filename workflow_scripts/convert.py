import sys

sys.path.insert(0, snakemake.scriptdir)
from _glue import setup

log = setup(snakemake, coremltools=True)
from anetts.compile.convert import ConvertOptions, convert_export

convert_export(snakemake.input.functions, snakemake.input.export_report, snakemake.output.package,
               snakemake.output.report, ConvertOptions.make(**snakemake.params.options),
               dict(snakemake.params.model_meta), out_inspect=snakemake.output.inspect)
