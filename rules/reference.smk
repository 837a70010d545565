rule reference:
    """One upstream forward per bucket; its stage-boundary tensors are the examples of every stage."""
    input:
        weights=PATHS["weights"],
        code=lambda w: WF.reference_code(w.model),
    output:
        PATHS["reference"],
    log:
        log_of("reference"),
    benchmark:
        benchmark_of("reference")
    priority: RES.priority("reference")
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("reference")
    resources:
        **RES.of("reference"),
    params:
        size=lambda w: WF.reference_size(w.model, w.bucket),
        run=lambda w: WF.reference_params(w.model),
        family=lambda w: WF.family_of(w.model),
        versions=lambda w: WF.upstream_versions(w.model),
    script:
        "../workflow_scripts/reference.py"
