rule convert:
    """TorchScript → ML Program .mlpackage (fp16 compute, fp32/int32 I/O) + a JSON report + its inspect JSON."""
    input:
        torchscript="artifacts/{model}/export/{stage}/{bucket}.pt",
        export_report="artifacts/{model}/export/{stage}/{bucket}.export.json",
        code=WF.convert_code(),
    output:
        package=directory("artifacts/{model}/packages/{stage}/{bucket}.mlpackage"),
        report="artifacts/{model}/packages/{stage}/{bucket}.json",
        # op histogram, weight bytes, I/O and the ANE lint (`anetts inspect --json` of the package)
        inspect="artifacts/{model}/inspect/{stage}/{bucket}.json",
    params:
        options=lambda w: WF.convert_options(w.model, w.stage),
        model_meta=lambda w: WF.model_meta(w.model),
        versions=WF.versions("coremltools", "numpy"),
    log:
        "artifacts/{model}/logs/convert/{stage}/{bucket}.log",
    benchmark:
        "artifacts/{model}/benchmarks/convert/{stage}/{bucket}.tsv"
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("convert")
    resources:
        **RES.of("convert"),
    script:
        "../workflow_scripts/convert.py"
