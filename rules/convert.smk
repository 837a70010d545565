rule convert:
    """The traced export → an ML Program .mlpackage (fp16 compute, fp32/int32 I/O) + a JSON report +
    its inspect JSON: one function, or several (Fish's AR stages) merged into one multifunction
    package sharing weights and fp16 states."""
    input:
        functions=PATHS["export_functions"],
        export_report=PATHS["export_report"],
        code=WF.convert_code(),
    output:
        package=directory(PATHS["package"]),
        report=PATHS["package_report"],
        # op histogram, weight bytes, I/O and the ANE lint (`anetts inspect --json` of the package)
        inspect=PATHS["inspect"],
    log:
        log_of("convert"),
    benchmark:
        benchmark_of("convert")
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
