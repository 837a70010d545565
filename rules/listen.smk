rule listen:
    """The listener gate (real-weights models that configure `listen`): the corpus through upstream at
    two seeds and through the compiled packages (MIL executor on Linux, Core ML on macOS), judged by
    words, voice, quality, pitch and log-mel against upstream's own seed-to-seed floor. Its verdict
    goes in the manifest; the worst sentence per metric is kept as wav files for the report.
    """
    input:
        weights=PATHS["weights"],
        reports=lambda w: WF.package_reports(w.model),
        packages=lambda w: WF.packages(w.model),
        torchscripts=lambda w: WF.torchscripts(w.model),
        # only packages that passed their own gates are judged
        parity=lambda w: WF.parity_reports(w.model),
        scenarios=lambda w: WF.scenarios(w.model),
        assets=PATHS["assets"],
        code=lambda w: WF.listen_code(w.model),
    output:
        report=PATHS["listen"],
        clips=directory(PATHS["listen_clips"]),
    log:
        log_of("listen"),
    benchmark:
        benchmark_of("listen")
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("listen")
    resources:
        **RES.of("listen"),
    params:
        model_meta=lambda w: WF.model_meta(w.model),
        stages=lambda w: WF.stage_settings(w.model),
        settings=lambda w: WF.listen_settings(w.model),
    script:
        "../workflow_scripts/listen.py"
