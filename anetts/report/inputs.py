"""Which files a model's report reads: one list for the Snakemake rule (its declared inputs) and
for `anetts report` on a directory.

The build's own outputs come from the config (through :class:`anetts.workflow.WorkflowConfig`);
benchmark JSONs (`bench/*.json` from `anetts bench`, possibly sent back from a Mac, and
`benchmarks/*.json` from the scripts in benchmarks/) are whatever lies there when the DAG is built.
"""
from __future__ import annotations

from pathlib import Path

from anetts import artifacts

# The keys of an inputs mapping, in the order the report shows them.
KEYS = ("manifest", "parity_summary", "waveform_plot", "parity", "parity_arrays", "inspect", "package_reports",
        "bundles", "bundle_parity", "job_benchmarks", "runtime_benchmarks", "bench", "listen", "listen_clips")


def audio_output(family: str) -> dict:
    """{stage, output, sample_rate} of the audio the family's build makes (its declaration), or {}."""
    from anetts.families import declaration

    decl = declaration(family)
    if decl.audio is None:
        return {}
    return {"stage": decl.audio[0], "output": decl.audio[1], "sample_rate": decl.audio[2]}


def found_jsons(folder: Path) -> list[str]:
    folder = Path(folder)
    return sorted(str(p) for p in folder.glob("*.json") if p.is_file()) if folder.is_dir() else []


def benchmark_files(wf, model: str, patterns: dict[str, tuple[str, str | None]]) -> list[str]:
    """Every `benchmark:` file of the model's jobs, from the rules' own patterns.

    `patterns`: rule name → (benchmark pattern with wildcards among model, stage, bucket; which
    jobs the rule has, `anetts.resources.RuleSpec.jobs`). The combinations are the model's:
    stage+bucket → its packages (of its bundled stages for "bundled"), stage → its stages, bucket → the
    shared reference buckets (the chain checks' for "chain"), none → one per model ("end_to_end":
    only if the model has the check).
    """
    out = []
    for rule, (pattern, jobs) in sorted(patterns.items()):
        if jobs == "end_to_end" and not wf.end_to_end_reports(model) or jobs == "listen" and not wf.listen_reports(model):
            continue
        stages = wf.bundled_stages(model) if jobs == "bundled" else wf.stages(model)
        if jobs == "chain":
            reference = [Path(p).stem for p in wf.chain_reports(model)]
        else:
            reference = sorted({Path(p).stem for s in stages for b in wf.buckets(model, s)
                                for p in wf.export_reference(model, s, b)})
        combos = {(): [{}], ("stage",): [{"stage": s} for s in stages], ("bucket",): [{"bucket": b} for b in reference],
                  ("bucket", "stage"): [{"stage": s, "bucket": b} for s in stages for b in wf.buckets(model, s)]}
        names = tuple(sorted(n for n in ("stage", "bucket") if "{" + n + "}" in pattern))
        if names not in combos:
            raise ValueError(f"rule {rule}: benchmark pattern {pattern!r} has wildcards the report cannot expand")
        for c in combos[names]:
            out.append(pattern.format(model=model, **c))
    return out


def report_inputs(wf, model: str, benchmark_patterns: dict[str, tuple[str, str | None]], root: Path = artifacts.ARTIFACTS) -> dict[str, list[str]]:
    """Named lists of the files the report of `model` reads (all declared inputs of its rule)."""
    stages = wf.stages(model)
    mdir = artifacts.model_dir(model, root)
    audio = wf.audio_output(model).get("stage")
    audio_arrays = [wf.parity_arrays(model, s, b) for s in stages for b in wf.buckets(model, s) if s == audio]
    return {
        "manifest": [str(artifacts.manifest_path(model, root))],
        "parity_summary": [str(mdir / "parity_summary.json")],
        "waveform_plot": [str(mdir / "parity_waveform.png")],
        "parity": wf.parity_reports(model),
        "parity_arrays": audio_arrays,
        "inspect": wf.inspect_reports(model),
        "package_reports": wf.package_reports(model),
        "bundles": [str(Path(b).with_suffix(".json")) for b in wf.bundles(model)],
        "bundle_parity": wf.bundle_parity_reports(model),
        "job_benchmarks": benchmark_files(wf, model, benchmark_patterns),
        "runtime_benchmarks": found_jsons(mdir / "benchmarks"),
        "bench": found_jsons(artifacts.bench_dir(model, root)),
        "listen": wf.listen_reports(model),
        "listen_clips": [str(artifacts.listen_clips_dir(model, root))] if wf.listen_reports(model) else [],
    }


def discover_inputs(model_dir: Path) -> dict[str, list[str]]:
    """The same lists for a model directory alone (no config): what its manifest and folders hold."""
    import json

    mdir = Path(model_dir)
    manifest = mdir / "manifest.json"
    if not manifest.is_file():
        raise FileNotFoundError(f"report input {manifest} (manifest) is missing")
    try:
        m = json.loads(manifest.read_text(encoding="utf-8"))
        pkgs = [(p["stage"], p["bucket"]) for p in m["packages"]]
        stages = sorted({b["stage"] for b in m.get("bundles", [])})
        family = m["family"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"report input {manifest} (manifest) is not a valid manifest: {e}") from e
    root, model = mdir.parent, mdir.name
    audio = audio_output(family).get("stage")
    return {
        "manifest": [str(manifest)],
        "parity_summary": [str(mdir / "parity_summary.json")],
        "waveform_plot": [str(mdir / "parity_waveform.png")],
        "parity": [str(artifacts.parity_path(model, s, b, root)) for s, b in pkgs],
        "parity_arrays": [str(artifacts.parity_path(model, s, b, root).with_suffix(".outputs.npz"))
                          for s, b in pkgs if s == audio],
        "inspect": [str(artifacts.inspect_path(model, s, b, root)) for s, b in pkgs],
        "package_reports": [str(artifacts.package_report(model, s, b, root)) for s, b in pkgs],
        "bundles": [str(artifacts.bundle_path(model, s, root).with_suffix(".json")) for s in stages],
        "bundle_parity": [str(artifacts.bundle_path(model, s, root).with_suffix(".parity.json")) for s in stages],
        "job_benchmarks": sorted(str(p) for p in (mdir / "benchmarks").rglob("*.tsv")),
        "runtime_benchmarks": found_jsons(mdir / "benchmarks"),
        "bench": found_jsons(artifacts.bench_dir(model, root)),
        "listen": [str(artifacts.listen_path(model, root))] if m.get("listen") else [],
        "listen_clips": [str(artifacts.listen_clips_dir(model, root))] if m.get("listen") else [],
    }
