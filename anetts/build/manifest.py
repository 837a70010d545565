"""`artifacts/<model>/manifest.json`: the contract between the build and everything after it.

Per package: stage, bucket, function name, path (relative to the model dir), sha256 of its
contents, inputs/outputs (name, shape, dtype), geometry, compute-unit hint, parity verdict.
"""
from __future__ import annotations

import json
from pathlib import Path

from anetts.artifacts import atomic_outputs, tree_sha256, write_json
from anetts.families import get_family
from anetts.provenance import provenance

MANIFEST_VERSION = 1


def write_manifest(out: Path, weights_dir: Path, reports: list, packages: list, torchscripts: list,
                   model_meta: dict, stages: dict) -> dict:
    out = Path(out)
    model_dir = out.parent.resolve()
    family = get_family(model_meta["family"])
    source = json.loads((Path(weights_dir) / "source.json").read_text(encoding="utf-8"))

    def rel(p) -> str:
        return Path(p).resolve().relative_to(model_dir).as_posix()

    entries = []
    for report_path, package, torchscript in zip(reports, packages, torchscripts):
        report = json.loads(Path(report_path).read_text(encoding="utf-8"))
        entries.append({
            "stage": report["stage"],
            "bucket": report["bucket"],
            "function": "main",
            "path": rel(package),
            "sha256": tree_sha256(package),
            "bytes": report["bytes"],
            "inputs": report["inputs"],
            "outputs": report["outputs"],
            "geometry": report["geometry"],
            "deployment_target": report["deployment_target"],
            "precision": report["precision"],
            "compute_units": stages[report["stage"]]["compute_units"],
            "parity": None,  # filled once the package passed its parity gate
            # the traced export the torch backend runs (same I/O as the package)
            "torchscript": rel(torchscript),
            "torchscript_sha256": tree_sha256(torchscript),
            "example_inputs": rel(Path(torchscript).with_suffix(".inputs.npz")),
        })
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        **model_meta,
        "weights_dir": rel(weights_dir),
        "weights": {k: source.get(k) for k in ("source", "preset", "seed", "repo_id", "revision", "path", "voices", "files")},
        "host": family.host_params(Path(weights_dir)) if family.host_params else {},
        "stages": stages,
        "packages": entries,
        "provenance": provenance(),
    }
    with atomic_outputs(out) as (tmp,):
        write_json(tmp, manifest)
    return manifest
