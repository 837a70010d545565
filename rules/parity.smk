rule parity:
    """Upstream eager fp32 vs traced export vs the package (MIL executor; CoreML on macOS), gated.

    The eager and traced outputs come from the export job (same inputs), so this job loads
    neither the model nor the TorchScript: one executor run per package.
    """
    input:
        package="artifacts/{model}/packages/{stage}/{bucket}.mlpackage",
        example_inputs="artifacts/{model}/export/{stage}/{bucket}.inputs.npz",
        export_outputs="artifacts/{model}/export/{stage}/{bucket}.outputs.npz",
        export_report="artifacts/{model}/export/{stage}/{bucket}.export.json",
        code=WF.parity_code(),
    output:
        report="artifacts/{model}/parity/{stage}/{bucket}.json",
        arrays="artifacts/{model}/parity/{stage}/{bucket}.outputs.npz",
    params:
        gate=lambda w: WF.parity_gate(w.model, w.stage),
        compute_units=lambda w: WF.convert_options(w.model, w.stage)["compute_units"],
    log:
        "artifacts/{model}/logs/parity/{stage}/{bucket}.log",
    benchmark:
        "artifacts/{model}/benchmarks/parity/{stage}/{bucket}.tsv"
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("parity")
    resources:
        **RES.of("parity"),
    script:
        "../workflow_scripts/parity.py"


rule parity_summary:
    """Per-model parity summary: markdown table, JSON and plots (SNR per bucket, generator diff)."""
    input:
        reports=lambda w: WF.parity_reports(w.model),
        arrays=lambda w: WF.parity_arrays_all(w.model),
        code=WF.summary_code(),
    output:
        markdown="artifacts/{model}/parity_summary.md",
        json="artifacts/{model}/parity_summary.json",
        snr_plot="artifacts/{model}/parity_snr.png",
        waveform_plot="artifacts/{model}/parity_waveform.png",
    params:
        model=lambda w: w.model,
        audio=lambda w: WF.audio_output(w.model),
    log:
        "artifacts/{model}/logs/parity_summary.log",
    benchmark:
        "artifacts/{model}/benchmarks/parity_summary.tsv"
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("parity_summary")
    resources:
        **RES.of("parity_summary"),
    script:
        "../workflow_scripts/parity_summary.py"
