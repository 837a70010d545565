rule parity:
    """Upstream eager fp32 vs traced export vs the package (MIL executor; CoreML on macOS), gated."""
    input:
        weights="artifacts/{model}/weights",
        package="artifacts/{model}/packages/{stage}/{bucket}.mlpackage",
        torchscript="artifacts/{model}/export/{stage}/{bucket}.pt",
        example_inputs="artifacts/{model}/export/{stage}/{bucket}.inputs.npz",
        code=WF.parity_code(),
    output:
        "artifacts/{model}/parity/{stage}/{bucket}.json",
    params:
        size=lambda w: WF.bucket_size(w.model, w.stage, w.bucket),
        family=lambda w: WF.family_of(w.model),
        gate=lambda w: WF.parity_gate(w.model, w.stage),
        compute_units=lambda w: WF.convert_options(w.model, w.stage)["compute_units"],
    log:
        "artifacts/{model}/logs/parity/{stage}/{bucket}.log",
    benchmark:
        "artifacts/{model}/benchmarks/parity/{stage}/{bucket}.tsv"
    threads: 2
    script:
        "../workflow_scripts/parity.py"
