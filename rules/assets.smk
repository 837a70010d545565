rule runtime_assets:
    """Files the runtime reads besides packages (Kokoro: vocab and voice packs), listed in the manifest."""
    input:
        weights=PATHS["weights"],
        code=lambda w: WF.assets_code(w.model),
    output:
        directory(PATHS["assets"]),
    log:
        log_of("runtime_assets"),
    benchmark:
        benchmark_of("runtime_assets")
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("runtime_assets")
    resources:
        **RES.of("runtime_assets"),
    params:
        family=lambda w: WF.family_of(w.model),
    script:
        "../workflow_scripts/assets.py"
