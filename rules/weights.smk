rule weights:
    """Materialize weights (synthetic / hf / local) in the upstream layout and validate them."""
    input:
        code=lambda w: WF.weights_code(w.model),
        files=lambda w: WF.weights_inputs(w.model),
    output:
        directory(PATHS["weights"]),
    log:
        log_of("weights"),
    benchmark:
        benchmark_of("weights")
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("weights")
    resources:
        **RES.of("weights"),
    params:
        family=lambda w: WF.family_of(w.model),
        source=lambda w: WF.weights_source(w.model),
        versions=lambda w: WF.upstream_versions(w.model),
    script:
        "../workflow_scripts/weights.py"
