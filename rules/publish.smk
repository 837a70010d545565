# Publishing to the Hugging Face Hub: not part of `all` (it needs a token and the network).
#   snakemake publish --config model=NAME hf_repo=OWNER/REPO


# the commit needs the user's token and the network: it runs where snakemake was started, never on a node
localrules:
    publish_model,


rule publish:
    """Target: publish the configured model (`hf_repo`, or `publish.repo_id` in config.yaml)."""
    input:
        str(artifacts.published_path(config["model"])),


rule publish_model:
    """Gate, stage artifacts/{model}/publish/tree, commit it in one atomic commit, record the commit sha."""
    input:
        # only what passed every gate: the manifest lists verified packages, the summary every verdict
        manifest=PATHS["manifest"],
        summary=PATHS["parity_summary_json"],
        code=WF.publish_code(),
    output:
        PATHS["published"],
    log:
        log_of("publish"),
    conda:
        "../envs/anetts.yaml"
    params:
        target=lambda w: WF.publish_target(),
    script:
        "../workflow_scripts/publish.py"
