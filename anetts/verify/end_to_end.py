"""The end-to-end gate (rule `end_to_end`): the runtime composing the compiled packages, against
upstream on the family's fixed texts.

Per-stage gates feed each stage upstream's own inputs; the runtime feeds each stage the previous
compiled stage's output, so errors compound where no per-stage gate looks (Kokoro: fp16 F0
integrates into the harmonic phase). The check runs before the manifest is written — it is one of
the manifest's inputs — so it builds the manifest in memory (`build_manifest`) and opens the runtime
on it. On Linux the packages run on the MIL executor, on macOS through Core ML.
"""
from __future__ import annotations

from pathlib import Path

from anetts.artifacts import clear_outputs
from anetts.compile.manifest import build_manifest
from anetts.families import get_family
from anetts.gate import ParityError, write_checks_verdict
from anetts.runtime.manifest import MANIFEST_NAME
from anetts.runtime.runners import default_executor

# the executor that runs the compiled packages themselves: the default one for a model whose
# TorchScript exports are not what is checked (Core ML on macOS, the MIL executor elsewhere)
COMPILED_BACKEND = default_executor(has_torchscript=False)


def compiled_runtime(model_dir: Path, manifest: dict):
    """The family's runtime over an in-memory manifest, on the backend that runs the packages."""
    from anetts.loader import runtime_class
    from anetts.runtime import Runner
    from anetts.runtime.manifest import ModelArtifacts

    artifacts = ModelArtifacts.from_manifest(model_dir, manifest, where=f"{model_dir} (manifest being built)")
    return runtime_class(artifacts.family)(artifacts, Runner(COMPILED_BACKEND, artifacts))


def check_end_to_end_report(out_json: Path, model_dir: Path, manifest_inputs: dict, params: dict, gate: dict) -> dict:
    """`manifest_inputs`: `build_manifest`'s keyword arguments (the manifest rule's inputs but this one)."""
    out_json = Path(out_json)
    # the model's manifest is downstream of this verdict: an old one would still claim the old pass
    clear_outputs(out_json, Path(model_dir) / MANIFEST_NAME)
    manifest = build_manifest(model_dir, **manifest_inputs)
    family = get_family(manifest["family"])
    if family.check_end_to_end is None:
        raise ParityError(f"family {manifest['family']!r} has no end-to-end check")
    runtime = compiled_runtime(Path(model_dir), manifest)
    report = family.check_end_to_end(runtime, Path(manifest_inputs["weights_dir"]), dict(params), dict(gate))
    report = {"backend": runtime.backend.name, **report}
    return write_checks_verdict(report, out_json, "end-to-end check")
