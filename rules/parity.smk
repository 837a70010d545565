rule parity:
    """The package plays its export's scenario (MIL executor; CoreML on macOS), gated: each call
    against the outputs the export expects (a one-call stage's eager fp32 outputs, a Fish AR stage's
    upstream tensors, the state carried), logits also by top-1 agreement; the export's torch figure
    beside it. This job loads neither the model nor the TorchScript.
    """
    input:
        scenario=PATHS["scenario"],
        export_report=PATHS["export_report"],
        package=PATHS["package"],
        code=WF.parity_code(),
    output:
        report=PATHS["parity"],
        arrays=PATHS["parity_arrays"],
    log:
        log_of("parity"),
    benchmark:
        benchmark_of("parity")
    priority: RES.priority("parity")
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("parity")
    resources:
        **RES.of("parity"),
    params:
        gate=lambda w: WF.parity_gate(w.model, w.stage),
        compute_units=lambda w: WF.convert_options(w.model, w.stage)["compute_units"],
    script:
        "../workflow_scripts/parity.py"


rule chain_parity:
    """The compiled packages composed as the runtime composes them, against upstream (families
    that declare a chain check), at one reference bucket. Gated; its verdict goes in the manifest.
    """
    input:
        packages=lambda w: WF.chain_packages(w.model, w.bucket),
        # their typed functions, which the chain check's runners load
        reports=lambda w: WF.chain_package_reports(w.model, w.bucket),
        # only packages that passed their own gates are composed
        parity=lambda w: WF.chain_parity_inputs(w.model, w.bucket),
        assets=PATHS["assets"],
        reference=PATHS["reference"],
        code=lambda w: WF.chain_code(w.model),
    output:
        PATHS["chain"],
    log:
        log_of("chain_parity"),
    benchmark:
        benchmark_of("chain_parity")
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("chain_parity")
    resources:
        **RES.of("chain_parity"),
    params:
        family=lambda w: WF.family_of(w.model),
        stages=lambda w: WF.chain_stages(w.model, w.bucket),
        stage_params=lambda w: {
            s: WF.stage_params(w.model, s) for s in WF.chain_stages(w.model, w.bucket)
        },
        settings=lambda w: WF.chain_settings(w.model),
        gate=lambda w: WF.chain_gate(w.model),
    script:
        "../workflow_scripts/chain_parity.py"


rule parity_summary:
    """Per-model parity summary: markdown table, JSON and plots (SNR per bucket, generator diff)."""
    input:
        reports=lambda w: WF.parity_reports(w.model),
        arrays=lambda w: WF.parity_arrays_all(w.model),
        code=WF.summary_code(),
    output:
        markdown=PATHS["parity_summary_markdown"],
        json=PATHS["parity_summary_json"],
        snr_plot=PATHS["parity_summary_snr_plot"],
        waveform_plot=PATHS["parity_summary_waveform_plot"],
    log:
        log_of("parity_summary"),
    benchmark:
        benchmark_of("parity_summary")
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("parity_summary")
    resources:
        **RES.of("parity_summary"),
    params:
        model=lambda w: w.model,
        audio=lambda w: WF.audio_output(w.model),
    script:
        "../workflow_scripts/parity_summary.py"


rule end_to_end:
    """The runtime over the compiled packages (MIL executor on Linux, Core ML on macOS) against
    upstream on the family's fixed texts, upstream's random draws replayed. Gated; its verdict goes
    in the manifest. It reads what the manifest rule reads and builds the manifest in memory.
    """
    input:
        weights=PATHS["weights"],
        reports=lambda w: WF.package_reports(w.model),
        packages=lambda w: WF.packages(w.model),
        torchscripts=lambda w: WF.torchscripts(w.model),
        # only packages that passed their own gates are composed
        parity=lambda w: WF.parity_reports(w.model),
        scenarios=lambda w: WF.scenarios(w.model),
        assets=PATHS["assets"],
        code=lambda w: WF.end_to_end_code(w.model),
    output:
        PATHS["end_to_end"],
    log:
        log_of("end_to_end"),
    benchmark:
        benchmark_of("end_to_end")
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("end_to_end")
    resources:
        **RES.of("end_to_end"),
    params:
        model_meta=lambda w: WF.model_meta(w.model),
        stages=lambda w: WF.stage_settings(w.model),
        settings=lambda w: WF.end_to_end_params(w.model),
        gate=lambda w: WF.end_to_end_gate(w.model),
        versions=lambda w: WF.upstream_versions(w.model),
    script:
        "../workflow_scripts/end_to_end.py"
