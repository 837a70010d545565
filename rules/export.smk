rule export:
    """Trace one stage at one bucket: its functions' TorchScript and the scenario parity plays (a
    one-call stage: one call on its example inputs, the eager outputs expected and the traced replay
    scored against them; a Fish AR stage: upstream's teacher-forced calls, the eager wrapper checked
    against them at fp32).
    """
    input:
        weights=PATHS["weights"],
        reference=lambda w: WF.export_reference(w.model, w.stage, w.bucket),
        # Snakemake does not follow imports: the stage's own sources are explicit inputs, so an
        # edit reruns exactly this stage's exports and what depends on them.
        code=lambda w: WF.stage_code(w.model, w.stage),
    output:
        functions=directory(PATHS["export_functions"]),
        scenario=PATHS["scenario"],
        report=PATHS["export_report"],
    log:
        log_of("export"),
    benchmark:
        benchmark_of("export")
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("export")
    resources:
        **RES.of("export"),
    params:
        size=lambda w: WF.bucket_size(w.model, w.stage, w.bucket),
        family=lambda w: WF.family_of(w.model),
        stage=lambda w: WF.stage_params(w.model, w.stage),
        versions=lambda w: WF.upstream_versions(w.model),
    script:
        "../workflow_scripts/export.py"
