from snakemake.io import strip_wildcard_constraints

from anetts.report.inputs import report_inputs


# Benchmark patterns of every rule that has one (the report's per-job build table).
REPORT_BENCHMARKS = {r.name: strip_wildcard_constraints(str(r.benchmark)) for r in workflow.rules if r.benchmark is not None}


rule report:
    """One self-contained HTML per model: parity, packages, bundles, build and bench figures, provenance.

    Every file it reads is an input: the build's outputs from the config, the `benchmark:` files of
    the model's jobs, and any bench/benchmark JSONs present when the DAG is built.
    """
    input:
        unpack(lambda w: report_inputs(WF, w.model, REPORT_BENCHMARKS)),
        code=WF.report_code(),
    output:
        "artifacts/{model}/report.html",
    log:
        "artifacts/{model}/logs/report.log",
    script:
        "../workflow_scripts/report.py"
