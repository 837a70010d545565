rule export:
    """Trace one stage at one bucket (TorchScript + example inputs), checked against eager."""
    input:
        weights=PATHS["weights"],
        reference=lambda w: WF.export_reference(w.model, w.stage, w.bucket),
        # Snakemake does not follow imports: the stage's own sources are explicit inputs, so an
        # edit reruns exactly this stage's exports and what depends on them.
        code=lambda w: WF.stage_code(w.model, w.stage),
    output:
        traced=PATHS["export_pt"],
        example_inputs=PATHS["example_inputs"],
        report=PATHS["export_report"],
        # eager (parity's reference) and traced outputs on the example inputs
        export_outputs=PATHS["export_outputs"],
    log:
        log_of("export"),
    benchmark:
        benchmark_of("export")
    wildcard_constraints:
        stage=WF.stage_regex("bucketed"),
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("export")
    resources:
        **RES.of("export"),
    params:
        size=lambda w: WF.bucket_size(w.model, w.stage, w.bucket),
        family=lambda w: WF.family_of(w.model),
        versions=lambda w: WF.upstream_versions(w.model),
    script:
        "../workflow_scripts/export.py"


# A scenario stage's export writes other files (a folder of one TorchScript per function, the
# scenario's calls) than a bucketed stage's, so the step is two rules; one script runs both.
rule export_scenario:
    """Trace a scenario stage's functions at one bucket and record its teacher-forced scenario
    (upstream's calls and outputs; the eager wrapper checked against them at fp32)."""
    input:
        weights=PATHS["weights"],
        reference=lambda w: WF.export_reference(w.model, w.stage, w.bucket),
        code=lambda w: WF.stage_code(w.model, w.stage),
    output:
        traced=directory(PATHS["export_functions"]),
        scenario=PATHS["scenario"],
        report=PATHS["export_report"],
    log:
        log_of("export_scenario"),
    benchmark:
        benchmark_of("export_scenario")
    wildcard_constraints:
        stage=WF.stage_regex("scenario"),
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("export_scenario")
    resources:
        **RES.of("export_scenario"),
    params:
        size=lambda w: WF.bucket_size(w.model, w.stage, w.bucket),
        family=lambda w: WF.family_of(w.model),
        stage=lambda w: WF.stage_params(w.model, w.stage),
        versions=lambda w: WF.upstream_versions(w.model),
    script:
        "../workflow_scripts/export.py"
