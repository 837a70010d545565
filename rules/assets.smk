rule runtime_assets:
    """Files the runtime reads besides packages (Kokoro: vocab and voice packs), listed in the manifest."""
    input:
        weights="artifacts/{model}/weights",
        code=lambda w: WF.assets_code(w.model),
    output:
        directory("artifacts/{model}/assets"),
    log:
        "artifacts/{model}/logs/runtime_assets.log",
    benchmark:
        "artifacts/{model}/benchmarks/runtime_assets.tsv"
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("runtime_assets")
    resources:
        **RES.of("runtime_assets"),
    params:
        family=lambda w: WF.family_of(w.model),
    script:
        "../workflow_scripts/assets.py"
