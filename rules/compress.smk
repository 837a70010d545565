# Compressed variants (config `variants`): weight-only int8 / palettized copies of the verified
# packages, each gated against the same eager fp32 reference as rule `parity` gates the package,
# then composed where the family has a chain check;
# `snakemake variants` builds them all.
from anetts.variants import VariantConfig

VC = VariantConfig(config, WF)


wildcard_constraints:
    # no configured variant: a pattern that matches nothing, so these rules never apply
    variant="|".join(VC.names) or "(?!x)x",


rule compress:
    """One verified package → its compressed variant (a package's functions still share one
    copy of the weights), kept only if it passes the variant's gate: scored as rule `parity`
    scores the package (its export's scenario)."""
    input:
        scenario=PATHS["scenario"],
        export_report=PATHS["export_report"],
        base_package=PATHS["package"],
        base_report=PATHS["package_report"],
        # only a package that passed its own gate is compressed
        base_parity=PATHS["parity"],
        code=VC.code(),
    output:
        package=directory(PATHS["variant_package"]),
        report=PATHS["variant_report"],
        parity=PATHS["variant_parity"],
    log:
        log_of("compress"),
    benchmark:
        benchmark_of("compress")
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


rule variant_chain_parity:
    """The variant's packages (compressed where it compresses, else the base ones) composed as the
    runtime composes them, against upstream; gated with the variant's gate, verdict in its manifest.
    """
    input:
        packages=lambda w: VC.chain_packages(w.model, w.variant, w.bucket),
        reports=lambda w: VC.chain_package_reports(w.model, w.variant, w.bucket),
        parity=lambda w: VC.chain_parity_inputs(w.model, w.variant, w.bucket),
        assets=PATHS["assets"],
        reference=PATHS["reference"],
        code=lambda w: WF.chain_code(w.model),
    output:
        PATHS["variant_chain"],
    log:
        log_of("variant_chain_parity"),
    benchmark:
        benchmark_of("variant_chain_parity")
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("variant_chain_parity")
    resources:
        **RES.of("variant_chain_parity"),
    params:
        family=lambda w: WF.family_of(w.model),
        stages=lambda w: WF.chain_stages(w.model, w.bucket),
        stage_params=lambda w: {
            s: WF.stage_params(w.model, s) for s in WF.chain_stages(w.model, w.bucket)
        },
        settings=lambda w: WF.chain_settings(w.model),
        gate=lambda w: VC.chain_gate(w.model, w.variant),
    script:
        "../workflow_scripts/chain_parity.py"


rule variant_manifest:
    """The variant's own manifest: its compressed packages plus the base packages of the other stages."""
    input:
        weights=PATHS["weights"],
        reports=lambda w: VC.package_reports(w.model, w.variant),
        packages=lambda w: VC.packages(w.model, w.variant),
        torchscripts=lambda w: WF.torchscripts(w.model),
        scenarios=lambda w: WF.scenarios(w.model),
        parity=lambda w: VC.parity_reports(w.model, w.variant),
        chain=lambda w: VC.chain_reports(w.model, w.variant),
        assets=PATHS["assets"],
    output:
        PATHS["variant_manifest"],
    log:
        log_of("variant_manifest"),
    benchmark:
        benchmark_of("variant_manifest")
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
    """Per compressed package: size vs its base package, dB (and top-1 where logits are declared); per
    variant: bytes, unique weight bytes, chain verdicts and (families that project speed) the
    weight bytes one generated frame reads and the ms/frame they take."""
    input:
        reports=lambda w: VC.compressed_reports(w.model),
        base_parity=lambda w: WF.parity_reports(w.model),
        # every variant whole: its manifest exists only once all its gates passed
        manifests=lambda w: VC.manifests(w.model, VC.names_for(w.model)),
        weights=PATHS["weights"],
        base_reports=lambda w: WF.package_reports(w.model),
        base_packages=lambda w: WF.packages(w.model),
        code=lambda w: VC.summary_code(w.model),
    output:
        json=PATHS["variants_summary"],
        markdown=PATHS["variants_summary_md"],
    log:
        log_of("variants_summary"),
    benchmark:
        benchmark_of("variants_summary")
    conda:
        "../envs/anetts.yaml"
    threads: RES.threads("variants_summary")
    resources:
        **RES.of("variants_summary"),
    params:
        variants=lambda w: VC.summary_inputs(w.model),
        family=lambda w: WF.family_of(w.model),
    script:
        "../workflow_scripts/variants_summary.py"


rule variants:
    """Every configured variant of `model`: manifests and the summary."""
    input:
        VC.targets(config["model"]),
