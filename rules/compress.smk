# Compressed variants (config `variants`): weight-only int8 / palettized copies of the verified
# packages, each gated against the same eager fp32 reference; `snakemake variants` builds them all.
from anetts.variants import VariantConfig

VC = VariantConfig(config, WF)


wildcard_constraints:
    # no configured variant: a pattern that matches nothing, so these rules never apply
    variant="|".join(VC.names) or "(?!x)x",


rule compress:
    """One verified package → its compressed variant, kept only if it passes the variant's gate."""
    input:
        base_package="artifacts/{model}/packages/{stage}/{bucket}.mlpackage",
        base_report="artifacts/{model}/packages/{stage}/{bucket}.json",
        # only a package that passed its own gate is compressed
        base_parity="artifacts/{model}/parity/{stage}/{bucket}.json",
        example_inputs="artifacts/{model}/export/{stage}/{bucket}.inputs.npz",
        export_outputs="artifacts/{model}/export/{stage}/{bucket}.outputs.npz",
        export_report="artifacts/{model}/export/{stage}/{bucket}.export.json",
        code=VC.code(),
    output:
        package=directory(
            "artifacts/{model}/variants/{variant}/packages/{stage}/{bucket}.mlpackage"
        ),
        report="artifacts/{model}/variants/{variant}/packages/{stage}/{bucket}.json",
        parity="artifacts/{model}/variants/{variant}/parity/{stage}/{bucket}.json",
    log:
        "artifacts/{model}/logs/compress/{variant}/{stage}/{bucket}.log",
    benchmark:
        "artifacts/{model}/benchmarks/compress/{variant}/{stage}/{bucket}.tsv"
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("compress")
    resources:
        **RES.of("compress"),
    params:
        settings=lambda w: VC.settings(w.model, w.variant, w.stage),
        gate=lambda w: VC.gate(w.model, w.variant, w.stage),
        default_gate=lambda w: WF.parity_gate(w.model, w.stage),
        compute_units=lambda w: WF.convert_options(w.model, w.stage)["compute_units"],
        versions=WF.versions("coremltools", "numpy"),
    script:
        "../workflow_scripts/compress.py"


rule variant_manifest:
    """The variant's own manifest: its compressed packages plus the base packages of the other stages."""
    input:
        weights="artifacts/{model}/weights",
        reports=lambda w: VC.package_reports(w.model, w.variant),
        packages=lambda w: VC.packages(w.model, w.variant),
        torchscripts=lambda w: WF.torchscripts(w.model),
        parity=lambda w: VC.parity_reports(w.model, w.variant),
        assets="artifacts/{model}/assets",
    output:
        "artifacts/{model}/variants/{variant}/manifest.json",
    log:
        "artifacts/{model}/logs/variant_manifest/{variant}.log",
    benchmark:
        "artifacts/{model}/benchmarks/variant_manifest/{variant}.tsv"
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("variant_manifest")
    resources:
        **RES.of("variant_manifest"),
    params:
        model_meta=lambda w: WF.model_meta(w.model),
        stages=lambda w: WF.stage_settings(w.model),
        compressed=lambda w: {
            s: VC.settings(w.model, w.variant, s)
            for s in VC.stages(w.model, w.variant)
        },
    script:
        "../workflow_scripts/variant_manifest.py"


rule variants_summary:
    """Size ratio vs the base package and dB per bucket, for every configured variant."""
    input:
        reports=lambda w: VC.compressed_reports(w.model),
        base_parity=lambda w: WF.parity_reports(w.model),
    output:
        json="artifacts/{model}/variants/summary.json",
        markdown="artifacts/{model}/variants/summary.md",
    log:
        "artifacts/{model}/logs/variants_summary.log",
    benchmark:
        "artifacts/{model}/benchmarks/variants_summary.tsv"
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("variants_summary")
    resources:
        **RES.of("variants_summary"),
    script:
        "../workflow_scripts/variants_summary.py"


rule variants:
    """Every configured variant of `model`: manifests and the summary."""
    input:
        VC.targets(config["model"]),
