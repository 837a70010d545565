rule bundle:
    """All verified buckets of a stage in one multifunction package (one function per bucket)."""
    input:
        packages=lambda w: [
            WF.package(w.model, w.stage, b) for b in WF.buckets(w.model, w.stage)
        ],
        # only buckets that passed their parity gate are bundled
        parity=lambda w: [
            WF.parity_report(w.model, w.stage, b) for b in WF.buckets(w.model, w.stage)
        ],
        code=WF.bundle_code(),
    output:
        package=directory("artifacts/{model}/bundles/{stage}.mlpackage"),
        report="artifacts/{model}/bundles/{stage}.json",
    log:
        "artifacts/{model}/logs/bundle/{stage}.log",
    benchmark:
        "artifacts/{model}/benchmarks/bundle/{stage}.tsv"
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("bundle")
    resources:
        **RES.of("bundle"),
    params:
        buckets=lambda w: WF.buckets(w.model, w.stage),
        model_meta=lambda w: WF.model_meta(w.model),
    script:
        "../workflow_scripts/bundle.py"


rule bundle_parity:
    """Each bundle function against the upstream eager output stored by its bucket's parity job."""
    input:
        bundle="artifacts/{model}/bundles/{stage}.mlpackage",
        example_inputs=lambda w: [
            f"{WF.export_base(w.model, w.stage, b)}.inputs.npz"
            for b in WF.buckets(w.model, w.stage)
        ],
        export_reports=lambda w: [
            f"{WF.export_base(w.model, w.stage, b)}.export.json"
            for b in WF.buckets(w.model, w.stage)
        ],
        reference_arrays=lambda w: [
            WF.parity_arrays(w.model, w.stage, b) for b in WF.buckets(w.model, w.stage)
        ],
        code=WF.parity_code(),
    output:
        "artifacts/{model}/bundles/{stage}.parity.json",
    log:
        "artifacts/{model}/logs/bundle_parity/{stage}.log",
    benchmark:
        "artifacts/{model}/benchmarks/bundle_parity/{stage}.tsv"
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("bundle_parity")
    resources:
        **RES.of("bundle_parity"),
    params:
        buckets=lambda w: WF.buckets(w.model, w.stage),
        gate=lambda w: WF.parity_gate(w.model, w.stage),
    script:
        "../workflow_scripts/bundle_parity.py"
