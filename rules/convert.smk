rule convert:
    """The traced export → an ML Program .mlpackage (fp16 compute, fp32/int32 I/O) + a JSON report +
    its inspect JSON: one function, or a scenario stage's functions merged into one multifunction
    package sharing weights and fp16 states."""
    input:
        traced=lambda w: WF.export_files(w.model, w.stage, w.bucket)["traced"],
        export_report="artifacts/{model}/export/{stage}/{bucket}.export.json",
        code=WF.convert_code(),
    output:
        package=directory("artifacts/{model}/packages/{stage}/{bucket}.mlpackage"),
        report="artifacts/{model}/packages/{stage}/{bucket}.json",
        # op histogram, weight bytes, I/O and the ANE lint (`anetts inspect --json` of the package)
        inspect="artifacts/{model}/inspect/{stage}/{bucket}.json",
    log:
        "artifacts/{model}/logs/convert/{stage}/{bucket}.log",
    benchmark:
        "artifacts/{model}/benchmarks/convert/{stage}/{bucket}.tsv"
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("convert")
    resources:
        **RES.of("convert"),
    params:
        options=lambda w: WF.convert_options(w.model, w.stage),
        model_meta=lambda w: WF.model_meta(w.model),
        versions=WF.versions("coremltools", "numpy"),
    script:
        "../workflow_scripts/convert.py"
