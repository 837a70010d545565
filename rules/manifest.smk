rule manifest:
    """The contract read by the runtime: every package with its I/O, geometry and sha256."""
    input:
        weights=PATHS["weights"],
        reports=lambda w: WF.package_reports(w.model),
        packages=lambda w: WF.packages(w.model),
        torchscripts=lambda w: WF.torchscripts(w.model),
        # a package is listed only once it passed its parity gate
        parity=lambda w: WF.parity_reports(w.model),
        bundles=lambda w: WF.bundles(w.model),
        bundle_reports=lambda w: WF.bundle_reports(w.model),
        bundle_parity=lambda w: WF.bundle_parity_reports(w.model),
        scenarios=lambda w: WF.scenarios(w.model),
        assets=PATHS["assets"],
        # the compiled chain's gate, for families that declare one
        chain=lambda w: WF.chain_reports(w.model),
        # the runtime end to end over the compiled packages, for families that declare a check
        end_to_end=lambda w: WF.end_to_end_reports(w.model),
        # the listener gate, for models that configure one (real weights)
        listen=lambda w: WF.listen_reports(w.model),
        code=lambda w: WF.manifest_code(w.model),
    output:
        PATHS["manifest"],
    log:
        log_of("manifest"),
    benchmark:
        benchmark_of("manifest")
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("manifest")
    resources:
        **RES.of("manifest"),
    params:
        model_meta=lambda w: WF.model_meta(w.model),
        stages=lambda w: WF.stage_settings(w.model),
    script:
        "../workflow_scripts/manifest.py"
