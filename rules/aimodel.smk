rule aimodel:
    """Stage wrapper → torch.export → coreai-torch → `.aimodel` (Core AI, OS 27+) + a JSON report.

    Built from the export folder the `.mlpackage` comes from: its example inputs, and its eager
    outputs, which the rebuilt wrapper must reproduce.
    """
    input:
        weights=PATHS["weights"],
        scenario=PATHS["scenario"],
        export_report=PATHS["export_report"],
        code=lambda w: WF.aimodel_code(w.model, w.stage),
    output:
        asset=directory(PATHS["aimodel"]),
        report=PATHS["aimodel_report"],
    log:
        log_of("aimodel"),
    benchmark:
        benchmark_of("aimodel")
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("aimodel")
    resources:
        **RES.of("aimodel"),
    params:
        size=lambda w: WF.bucket_size(w.model, w.stage, w.bucket),
        family=lambda w: WF.family_of(w.model),
        stage=lambda w: WF.stage_params(w.model, w.stage),
        precision=lambda w: WF.convert_options(w.model, w.stage)["precision"],
        model_meta=lambda w: WF.model_meta(w.model),
        versions=WF.versions("torch", "coreai-core", "coreai-torch"),
    script:
        "../workflow_scripts/aimodel.py"


rule aimodel_parity:
    """The asset run by Apple's runtime vs the export's eager fp32 outputs, through the parity gate."""
    input:
        asset=PATHS["aimodel"],
        asset_report=PATHS["aimodel_report"],
        scenario=PATHS["scenario"],
        export_report=PATHS["export_report"],
        code=WF.aimodel_parity_code(),
    output:
        report=PATHS["aimodel_parity"],
        arrays=PATHS["aimodel_parity_arrays"],
    log:
        log_of("aimodel_parity"),
    benchmark:
        benchmark_of("aimodel_parity")
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("aimodel_parity")
    resources:
        **RES.of("aimodel_parity"),
    params:
        gate=lambda w: WF.parity_gate(w.model, w.stage),
    script:
        "../workflow_scripts/aimodel_parity.py"


rule aimodels:
    """Every configured stage/bucket of the selected model as a gated `.aimodel`."""
    input:
        WF.aimodel_parity_reports(config["model"]),
