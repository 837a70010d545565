"""`anetts.load`: a built model directory, or a published one, opened by the runtime its family declares.

    >>> import anetts
    >>> tts = anetts.load("artifacts/kokoro-tiny")               # backend: coreml on macOS, else torch
    >>> result = tts.synthesize("Hello there.", voice="syn_a")

The loader is where a model comes from (a directory, or ``hf://`` through :mod:`anetts.publish.download`)
and which runtime class reads it (the family declaration's ``runtime``); :mod:`anetts.runtime` itself
knows no family and no Hub. Importing this module imports no torch and no build module.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping

from anetts.artifacts import HF_SCHEME
from anetts.families import declaration
from anetts.runtime.errors import TTSError
from anetts.runtime.manifest import ModelArtifacts
from anetts.runtime.placement import measured_placement
from anetts.runtime.runners import Runner, default_executor

log = logging.getLogger(__name__)

DEFAULT_MODEL_DIR = Path("artifacts") / "kokoro-tiny"


def load(model_dir: str | Path = DEFAULT_MODEL_DIR, backend: str | None = None, *, threads: int | None = None,
         compute_units: str | Mapping[str, str] | None = None, deployment_target: str | None = None,
         endpoint: str | None = None, cache_dir: str | Path | None = None):
    """Open a built model directory (``artifacts/<model>``) or a published one (``hf://OWNER/REPO@REV``).

    ``hf://`` downloads the variant the backend needs into the Hugging Face cache (``cache_dir``:
    another cache; ``endpoint``: another Hub than ``HF_ENDPOINT``) and verifies every file before use (:mod:`anetts.publish.download`).

    ``backend``: an executor of :data:`anetts.runtime.runners.EXECUTORS`: ``"torch"`` (TorchScript
    exports, any OS), ``"coreml"`` (the .mlpackages through Core ML, macOS only), ``"mil"`` (the MIL
    reference executor) or ``"coreai"`` (.aimodel assets, where a model lists them); default
    :func:`~anetts.runtime.runners.default_executor` (coreml on macOS, else torch, or mil for a
    compressed variant), the same for every family. ``threads`` sets torch's intra-op threads (torch
    and mil); ``compute_units`` overrides the manifest's per-stage Core ML compute units (a name for
    all stages, or {stage: name}). Packages are verified (sha256) and loaded on first use. The runtime
    class is the one the manifest's family declares (Kokoro: KokoroRuntime; Fish: FishRuntime).
    ``deployment_target`` (e.g. ``"macOS15"``): the oldest OS the caller supports; from macOS15/iOS18
    on each stage runs from its multifunction bundle, otherwise (and by default) from per-bucket packages.
    Core ML with no ``compute_units``: a stage runs on the units ``anetts bench --placement`` chose for it on
    this chip, where the model's bench folder holds such a record (:func:`placed_units`).
    """
    resolves_inside = None
    if isinstance(model_dir, str) and model_dir.startswith(HF_SCHEME):
        from anetts.publish.download import fetch

        hub = fetch(model_dir, backend=backend, endpoint=endpoint, cache_dir=cache_dir)
        model_dir, resolves_inside = hub.model_dir, hub.repo_cache  # its files are links into the cache's blobs
    artifacts = ModelArtifacts.load(model_dir, deployment_target=deployment_target, resolves_inside=resolves_inside)
    cls = runtime_class(artifacts.family)  # before the backend loads any package
    if compute_units is None:
        compute_units = placed_units(artifacts, backend)
    return cls(artifacts, Runner(backend, artifacts, threads=threads, compute_units=compute_units))


def placed_units(artifacts: ModelArtifacts, backend: str | None) -> dict[str, str] | None:
    """Core ML: the compute units per stage that ``anetts bench --placement`` chose on this chip
    (:mod:`anetts.runtime.placement`), or None (then the manifest's per-stage units apply)."""
    executor = default_executor(artifacts.torchscript_faithful) if backend in (None, "auto") else backend
    if executor != "coreml":
        return None
    placed = measured_placement(artifacts.model_dir)
    if placed is None:
        return None
    log.info("compute units per stage from the placement measured on %s at %s (%s): %s", placed["chip"],
             placed["created_utc"], placed["file"], placed["units"])
    return placed["units"]


def runtime_class(family: str):
    """The runtime a family declares (``module:Class``); the manifest's family picks it."""
    decl = declaration(family)
    if decl.runtime is None:
        raise TTSError(f"family {family!r} has no runtime yet: its packages are built and verified, but "
                       f"nothing in anetts synthesizes speech from them")
    return decl.hook("runtime")
