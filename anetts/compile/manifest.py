"""`artifacts/<model>/manifest.json`: the contract between the build and everything after it.

Per package: stage, bucket, its typed functions (name, inputs, outputs, states: `FunctionSpec`) and
the one the bucket runs, path (relative to the model dir), sha256 of its contents, geometry,
compute-unit hint, parity verdict, MACs of one call per function. For the model: its ANE-eligible
share (`ane_share`, :mod:`anetts.compile.ane_share`). The reader is :mod:`anetts.runtime.manifest` (torch-free).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from anetts.artifacts import atomic_outputs, tree_sha256, write_json
from anetts.compile.ane_share import ane_share, one_call_macs, undefined_share
from anetts.families import declaration, get_family
from anetts.provenance import provenance
from anetts.runtime.manifest import MANIFEST_VERSION, unreadable_version  # noqa: F401 - the format, once
from anetts.tensors import FunctionSpec


def report_functions(report: dict) -> list[dict]:
    """A convert report's typed functions (FunctionSpec JSON list), checked."""
    functions = report.get("functions")
    if not functions or not all(isinstance(f, dict) for f in functions):
        raise ValueError(f"convert report of {report.get('stage')}/{report.get('bucket')} has no typed "
                         "functions (written by an older anetts); rebuild it")
    return [FunctionSpec.from_json(f).to_json() for f in functions]


def _parity_verdict(path: Path, rel) -> dict:
    r = json.loads(Path(path).read_text(encoding="utf-8"))
    return {"passed": r["passed"], "report": rel(path),
            **{f"{name}_min_snr_db": b.get("min_snr_db") for name, b in r["backends"].items() if "passed" in b}}


def _chain_verdict(path: Path, rel) -> dict:
    r = json.loads(Path(path).read_text(encoding="utf-8"))
    return {"bucket": Path(path).stem, "passed": r["passed"], "checks": r["checks"], "report": rel(path)}


def _listen_verdict(path: Path, rel) -> dict:
    r = json.loads(Path(path).read_text(encoding="utf-8"))
    return {"passed": r["passed"], "failed": r["failed"], "backend": r["backend"], "report": rel(path),
            "languages": {lang: {"clips": v["clips"], "checks": {k: {"candidate": c["candidate"], "floor": c["floor"],
                                                                     "limit": c["limit"], "passed": c["passed"]}
                                                                 for k, c in v["checks"].items()}}
                          for lang, v in r["languages"].items()}}


def _assets(assets_dir: Path, rel) -> list[dict]:
    files = sorted(p for p in Path(assets_dir).rglob("*") if p.is_file() and p.name != ".snakemake_timestamp")
    # "output": the build output (rule runtime_assets' directory) the file is part of; a file
    # removed alone from a directory output is not rebuilt, so `verify --repair` removes the output
    return [{"name": f.relative_to(assets_dir).as_posix(), "path": rel(f), "sha256": tree_sha256(f),
             "bytes": f.stat().st_size, "output": rel(assets_dir)} for f in files]


def _ane_share(family: str, packages: list[dict]) -> dict:
    decl = declaration(family)
    if decl.audio_seconds is None:
        return undefined_share(f"family {family} declares no audio seconds per bucket")
    return ane_share(packages, decl.hook("audio_seconds"))


def write_manifest(out: Path, *args, **kwargs) -> dict:
    """`build_manifest` for the directory of `out`, written atomically to `out`."""
    manifest = build_manifest(Path(out).parent, *args, **kwargs)
    with atomic_outputs(out) as (tmp,):
        write_json(tmp, manifest)
    return manifest


def build_manifest(model_dir: Path, weights_dir: Path, reports: list, packages: list, torchscripts: list,
                   scenarios: list, parity: list, model_meta: dict, stages: dict, bundles: list = (),
                   bundle_parity: list = (),
                   assets_dir: Path | None = None, chain: list = (), end_to_end: list = (),
                   listen: list = ()) -> dict:
    """The manifest of `model_dir` (paths relative to it), as a dict. The end-to-end check builds
    one without writing it: it composes the packages through the runtime before the manifest exists."""
    model_dir = Path(model_dir).resolve()
    family = get_family(model_meta["family"])
    source = json.loads((Path(weights_dir) / "source.json").read_text(encoding="utf-8"))

    def rel(p) -> str:
        # relpath, not relative_to: a variant's manifest (artifacts/<model>/variants/<v>/) lists
        # the model's own weights and uncompressed packages as ../../<path>
        return Path(os.path.relpath(Path(p).resolve(), model_dir)).as_posix()

    entries, share_inputs = [], []
    for report_path, package, torchscript, scenario, parity_path in zip(reports, packages, torchscripts, scenarios,
                                                                         parity):
        report = json.loads(Path(report_path).read_text(encoding="utf-8"))
        functions = report_functions(report)
        entry = {
            "stage": report["stage"],
            "bucket": report["bucket"],
            "function": report.get("default_function", functions[0]["name"]),
            "functions": functions,
            "path": rel(package),
            "sha256": tree_sha256(package),
            "bytes": report["bytes"],
            "geometry": report["geometry"],
            "deployment_target": report["deployment_target"],
            "precision": report["precision"],
            "compute_units": stages[report["stage"]]["compute_units"],
            "parity": _parity_verdict(parity_path, rel),
            # the traced export the torch backend runs: a folder of <function>.pt (same I/O as the package)
            "torchscript": rel(torchscript),
            "torchscript_sha256": tree_sha256(torchscript),
            # the calls its parity played (a one-call stage: one call on its example inputs)
            "scenario": rel(scenario),
        }
        if report.get("macs"):  # multiply-accumulates of one call per function (anetts.compile.macs)
            entry["macs"] = {name: m["total"] for name, m in report["macs"].items()}
        entries.append(entry)
        share_inputs.append({**{k: entry[k] for k in ("stage", "bucket", "geometry", "precision", "compute_units")},
                             "lint": report.get("lint", []), "macs": one_call_macs(report.get("macs"))})
    bundle_entries = []
    for bundle, parity_path in zip(bundles, bundle_parity):
        report = json.loads(Path(bundle).with_suffix(".json").read_text(encoding="utf-8"))
        verdict = json.loads(Path(parity_path).read_text(encoding="utf-8"))
        stage = verdict["stage"]
        # a bundle's functions are its buckets' functions, each renamed as in the bundle
        own = {e["bucket"]: e for e in entries if e["stage"] == stage}
        functions = []
        for function, bucket in report["buckets"].items():
            if bucket not in own or len(own[bucket]["functions"]) != 1:
                raise ValueError(f"bundle {bundle}: bucket {bucket} is not a one-function package of {stage}")
            functions.append({**own[bucket]["functions"][0], "name": function})
        bundle_entries.append({
            "stage": stage,
            "path": rel(bundle),
            "sha256": tree_sha256(bundle),
            "bytes": report["bundle_bytes"],
            "functions": functions,
            "buckets": report["buckets"],  # function name → bucket
            "default_function": report.get("default_function"),
            "weight_bytes_fp16": report.get("weight_bytes_fp16"),
            "ratio_to_fp16_weights": report.get("ratio"),
            "parity": {"passed": verdict["passed"], "report": rel(parity_path)},
        })
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        **model_meta,
        "weights_dir": rel(weights_dir),
        "weights": {k: source.get(k) for k in ("source", "preset", "seed", "repo_id", "revision", "path", "model", "sha256",
                                               "voices", "files")},
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
        # the build judged by listening against upstream's own seed-to-seed variation (real weights)
        "listen": [_listen_verdict(p, rel) for p in listen],
        # MACs per second of audio in CPU_AND_NE, fp16, lint-clean packages over all (issue #41)
        "ane_share": _ane_share(model_meta["family"], share_inputs),
        "provenance": provenance(),
    }
    return manifest
