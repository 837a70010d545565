from snakemake.io import strip_wildcard_constraints

from anetts.report.inputs import report_inputs
from anetts.resources import spec as rule_spec

# Benchmark patterns of the rules every `all` runs (the report's per-job build table). The optional
# targets' jobs (Core AI assets, compressed variants) are not inputs: the report must not make `all`
# build them, and `aimodel.stages` may select fewer stages than the packages; nor can the report read
# its own benchmark.
NOT_REPORTED = {
    "report",
    "compress",
    "variant_chain_parity",
    "variant_manifest",
    "variants_summary",
    "aimodel",
    "aimodel_parity",
}
REPORT_BENCHMARKS = {
    r.name: (strip_wildcard_constraints(str(r.benchmark)), rule_spec(r.name).jobs)
    for r in workflow.rules
    if r.benchmark is not None and r.name not in NOT_REPORTED
}


rule report:
    """One self-contained HTML per model: parity, packages, bundles, build and bench figures, provenance.

    Every file it reads is an input: the build's outputs from the config, the `benchmark:` files of
    the model's jobs, and any bench/benchmark JSONs present when the DAG is built.
    """
    input:
        unpack(lambda w: report_inputs(WF, w.model, REPORT_BENCHMARKS)),
        code=WF.report_code(),
    output:
        PATHS["report"],
    log:
        log_of("report"),
    benchmark:
        benchmark_of("report")
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("report")
    resources:
        **RES.of("report"),
    script:
        "../workflow_scripts/report.py"
