# ane-tts: text-to-speech models → ANE-friendly CoreML packages.
# Table of contents only; rules live in rules/*.smk, logic in the anetts package.
from snakemake.utils import min_version

min_version("9.0")


include: "rules/common.smk"  # reads config.yaml
include: "rules/weights.smk"
include: "rules/assets.smk"
include: "rules/reference.smk"
include: "rules/export.smk"
include: "rules/convert.smk"
include: "rules/parity.smk"
include: "rules/listen.smk"
include: "rules/bundle.smk"
include: "rules/manifest.smk"
include: "rules/aimodel.smk"
include: "rules/publish.smk"
include: "rules/compress.smk"
include: "rules/report.smk"  # last: it reads the other rules' benchmark patterns


rule all:
    input:
        manifest_file(config["model"]),
        WF.manifested_outputs(config["model"]),  # so a deleted package is rebuilt
        str(artifacts.parity_summary_paths(config["model"])["markdown"]),
        WF.inspect_reports(config["model"]),
        # Core AI assets only when config `aimodel.in_all` asks for them (`snakemake aimodels` otherwise)
        WF.aimodel_parity_reports(config["model"]) if WF.aimodel_in_all() else [],
        # compressed variants only where config sets `in_all: true` (else `snakemake variants`)
        VC.targets(config["model"], VC.in_all()),
        str(artifacts.report_path(config["model"])),
