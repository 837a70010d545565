"""The listener gate over a build (rule ``listen``, ``anetts listen --model-dir``).

In the DAG the gate runs before the manifest (the manifest records its verdict), so, as the end-to-end
gate does, it builds the manifest in memory and opens the runtime on it, on the backend that runs the
compiled packages (MIL executor on Linux, Core ML on macOS). The family's ``listen`` hook renders and
judges; this module writes the verdict: the report when every language passed, else a ``.failed.json``
beside it and an error naming each failed metric.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from anetts.artifacts import clear_outputs
from anetts.families import declaration
from anetts.runtime.manifest import MANIFEST_NAME
from anetts.gate import write_verdict


def judge_runtime(runtime, weights_dir: Path, settings: dict, clips_dir: Path) -> dict:
    """The family's listener verdict on ``runtime`` (no file written but the worst clips)."""
    decl = declaration(runtime.artifacts.family)
    if decl.listen is None:
        raise ValueError(f"family {decl.name!r} has no listener gate")
    return decl.hook("listen")(runtime, Path(weights_dir), dict(settings), Path(clips_dir))


def write_listen_verdict(report: dict, out_json: Path) -> dict:
    return write_verdict(report, out_json, lambda r: f"listener gate failed on {', '.join(r['failed'])}")


def check_listen_report(out_json: Path, clips_dir: Path, manifest_inputs: dict, settings: dict) -> dict:
    """`manifest_inputs`: `build_manifest`'s keyword arguments, as the end-to-end gate takes them."""
    from anetts.compile.manifest import build_manifest
    from anetts.verify.end_to_end import compiled_runtime

    model_dir = Path(out_json).parent
    clear_outputs(Path(out_json), model_dir / MANIFEST_NAME)  # the manifest is downstream of this verdict
    shutil.rmtree(clips_dir, ignore_errors=True)
    manifest = build_manifest(model_dir, **manifest_inputs)
    runtime = compiled_runtime(model_dir, manifest)
    report = judge_runtime(runtime, Path(manifest_inputs["weights_dir"]), settings, clips_dir)
    try:
        return write_listen_verdict(report, Path(out_json))
    except Exception:
        shutil.rmtree(clips_dir, ignore_errors=True)  # a failed gate leaves nothing that looks good
        raise
