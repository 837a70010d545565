"""`artifacts/<model>/manifest.json`: the contract between the build and everything after it.

Per package: stage, bucket, function name, path (relative to the model dir), sha256 of its
contents, inputs/outputs (name, shape, dtype), geometry, compute-unit hint, parity verdict.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from anetts.artifacts import atomic_outputs, tree_sha256, write_json
from anetts.families import get_family
from anetts.provenance import provenance

MANIFEST_VERSION = 2  # 2: runtime assets listed


def unreadable_version(manifest: dict) -> str | None:
    """Why this anetts cannot read `manifest`'s format (a newer or unknown version), else None.
    Fields added within a version are optional to readers, so an older reader of it is fine."""
    version = manifest.get("manifest_version")
    if isinstance(version, bool) or not isinstance(version, int):
        return f"manifest_version {version!r} is not a version this anetts knows (it reads {MANIFEST_VERSION})"
    if version > MANIFEST_VERSION:
        return (f"manifest_version {version} is newer than this anetts reads ({MANIFEST_VERSION}); "
                f"upgrade anetts or rebuild the model")
    return None


def _parity_verdict(path: Path, rel) -> dict:
    r = json.loads(Path(path).read_text(encoding="utf-8"))
    return {"passed": r["passed"], "report": rel(path),
            **{f"{name}_min_snr_db": b.get("min_snr_db") for name, b in r["backends"].items() if "passed" in b}}


def _chain_verdict(path: Path, rel) -> dict:
    r = json.loads(Path(path).read_text(encoding="utf-8"))
    return {"bucket": Path(path).stem, "passed": r["passed"], "checks": r["checks"], "report": rel(path)}


def _assets(assets_dir: Path, rel) -> list[dict]:
    files = sorted(p for p in Path(assets_dir).rglob("*") if p.is_file() and p.name != ".snakemake_timestamp")
    # "output": the build output (rule runtime_assets' directory) the file is part of; a file
    # removed alone from a directory output is not rebuilt, so `verify --repair` removes the output
    return [{"name": f.relative_to(assets_dir).as_posix(), "path": rel(f), "sha256": tree_sha256(f),
             "bytes": f.stat().st_size, "output": rel(assets_dir)} for f in files]


def write_manifest(out: Path, *args, **kwargs) -> dict:
    """`build_manifest` for the directory of `out`, written atomically to `out`."""
    manifest = build_manifest(Path(out).parent, *args, **kwargs)
    with atomic_outputs(out) as (tmp,):
        write_json(tmp, manifest)
    return manifest


def build_manifest(model_dir: Path, weights_dir: Path, reports: list, packages: list, torchscripts: list,
                   parity: list, model_meta: dict, stages: dict, bundles: list = (), bundle_parity: list = (),
                   assets_dir: Path | None = None, chain: list = (), end_to_end: list = ()) -> dict:
    """The manifest of `model_dir` (paths relative to it), as a dict. The end-to-end check builds
    one without writing it: it composes the packages through the runtime before the manifest exists."""
    model_dir = Path(model_dir).resolve()
    family = get_family(model_meta["family"])
    source = json.loads((Path(weights_dir) / "source.json").read_text(encoding="utf-8"))

    def rel(p) -> str:
        # relpath, not relative_to: a variant's manifest (artifacts/<model>/variants/<v>/) lists
        # the model's own weights and uncompressed packages as ../../<path>
        return Path(os.path.relpath(Path(p).resolve(), model_dir)).as_posix()

    entries = []
    for report_path, package, torchscript, parity_path in zip(reports, packages, torchscripts, parity):
        report = json.loads(Path(report_path).read_text(encoding="utf-8"))
        entry = {
            "stage": report["stage"],
            "bucket": report["bucket"],
            "function": report.get("default_function", "main"),
            "path": rel(package),
            "sha256": tree_sha256(package),
            "bytes": report["bytes"],
            "inputs": report["inputs"],
            "outputs": report["outputs"],
            "geometry": report["geometry"],
            "deployment_target": report["deployment_target"],
            "precision": report["precision"],
            "compute_units": stages[report["stage"]]["compute_units"],
            "parity": _parity_verdict(parity_path, rel),
            # the traced export the torch backend runs (same I/O as the package)
            "torchscript": rel(torchscript),
            "torchscript_sha256": tree_sha256(torchscript),
            "example_inputs": rel(Path(torchscript).with_suffix(".inputs.npz")),
        }
        if report.get("kind") == "scenario":
            # several functions sharing weights and states; parity played a scenario (its calls' file)
            # the convert report's typed list, keyed by name as manifest v2 readers expect
            entry.update({"kind": "scenario", "functions": {f["name"]: f for f in report["functions"]},
                          "example_inputs": rel(Path(torchscript).with_suffix(".scenario.npz"))})
        entries.append(entry)
    bundle_entries = []
    for bundle, parity_path in zip(bundles, bundle_parity):
        report = json.loads(Path(bundle).with_suffix(".json").read_text(encoding="utf-8"))
        verdict = json.loads(Path(parity_path).read_text(encoding="utf-8"))
        bundle_entries.append({
            "stage": verdict["stage"],
            "path": rel(bundle),
            "sha256": tree_sha256(bundle),
            "bytes": report["bundle_bytes"],
            "functions": report["buckets"],  # function name → bucket
            "default_function": report.get("default_function"),
            "weight_bytes_fp16": report.get("weight_bytes_fp16"),
            "ratio_to_fp16_weights": report.get("ratio"),
            "parity": {"passed": verdict["passed"], "report": rel(parity_path)},
        })
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        **model_meta,
        "weights_dir": rel(weights_dir),
        "weights": {k: source.get(k) for k in ("source", "preset", "seed", "repo_id", "revision", "path", "voices", "files")},
        "host": family.host_params(Path(weights_dir)) if family.host_params else {},
        "stages": stages,
        "packages": entries,
        "bundles": bundle_entries,
        # every file the runtime reads besides packages, so a model directory is all it needs
        "assets": _assets(assets_dir, rel) if assets_dir is not None else [],
        # the compiled packages composed as the runtime composes them, against upstream
        "chain": [_chain_verdict(p, rel) for p in chain],
        # the runtime's composition of the compiled packages against upstream, on fixed texts
        "end_to_end": [_chain_verdict(p, rel) for p in end_to_end],
        "provenance": provenance(),
    }
    return manifest
