rule aimodel:
    """Stage wrapper → torch.export → coreai-torch → `.aimodel` (Core AI, OS 27+) + a JSON report.

    Built from the export folder the `.mlpackage` comes from: its example inputs, and its eager
    outputs, which the rebuilt wrapper must reproduce.
    """
    input:
        weights="artifacts/{model}/weights",
        example_inputs="artifacts/{model}/export/{stage}/{bucket}.inputs.npz",
        export_outputs="artifacts/{model}/export/{stage}/{bucket}.outputs.npz",
        export_report="artifacts/{model}/export/{stage}/{bucket}.export.json",
        code=lambda w: WF.aimodel_code(w.model, w.stage),
    output:
        asset=directory("artifacts/{model}/aimodels/{stage}/{bucket}.aimodel"),
        report="artifacts/{model}/aimodels/{stage}/{bucket}.json",
    log:
        "artifacts/{model}/logs/aimodel/{stage}/{bucket}.log",
    benchmark:
        "artifacts/{model}/benchmarks/aimodel/{stage}/{bucket}.tsv"
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("aimodel")
    resources:
        **RES.of("aimodel"),
    params:
        size=lambda w: WF.bucket_size(w.model, w.stage, w.bucket),
        family=lambda w: WF.family_of(w.model),
        precision=lambda w: WF.convert_options(w.model, w.stage)["precision"],
        model_meta=lambda w: WF.model_meta(w.model),
        versions=WF.versions("torch", "coreai-core", "coreai-torch"),
    script:
        "../workflow_scripts/aimodel.py"


rule aimodel_parity:
    """The asset run by Apple's runtime vs the export's eager fp32 outputs, through the parity gate."""
    input:
        asset="artifacts/{model}/aimodels/{stage}/{bucket}.aimodel",
        asset_report="artifacts/{model}/aimodels/{stage}/{bucket}.json",
        example_inputs="artifacts/{model}/export/{stage}/{bucket}.inputs.npz",
        export_outputs="artifacts/{model}/export/{stage}/{bucket}.outputs.npz",
        export_report="artifacts/{model}/export/{stage}/{bucket}.export.json",
        code=WF.aimodel_parity_code(),
    output:
        report="artifacts/{model}/aimodel_parity/{stage}/{bucket}.json",
        arrays="artifacts/{model}/aimodel_parity/{stage}/{bucket}.outputs.npz",
    log:
        "artifacts/{model}/logs/aimodel_parity/{stage}/{bucket}.log",
    benchmark:
        "artifacts/{model}/benchmarks/aimodel_parity/{stage}/{bucket}.tsv"
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
