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
        package=directory(PATHS["bundle"]),
        report=PATHS["bundle_report"],
    log:
        log_of("bundle"),
    benchmark:
        benchmark_of("bundle")
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
    """Each bundle function against the upstream eager output stored by its bucket's parity job: a
    function that is its verified package's program again is scored by that package's outputs, any
    other is run."""
    input:
        bundle=PATHS["bundle"],
        packages=lambda w: [
            WF.package(w.model, w.stage, b) for b in WF.buckets(w.model, w.stage)
        ],
        scenarios=lambda w: [
            WF.export_files(w.model, w.stage, b)["scenario"]
            for b in WF.buckets(w.model, w.stage)
        ],
        export_reports=lambda w: [
            WF.export_files(w.model, w.stage, b)["report"]
            for b in WF.buckets(w.model, w.stage)
        ],
        parity_arrays=lambda w: [
            WF.parity_arrays(w.model, w.stage, b) for b in WF.buckets(w.model, w.stage)
        ],
        code=WF.bundle_parity_code(),
    output:
        PATHS["bundle_parity"],
    log:
        log_of("bundle_parity"),
    benchmark:
        benchmark_of("bundle_parity")
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
