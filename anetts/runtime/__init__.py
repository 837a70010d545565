"""Thin runtime: text -> 24 kHz speech from the built artifacts of a model.

    >>> from anetts.runtime import load
    >>> tts = load("artifacts/kokoro-tiny")                    # backend: torch (coreml on macOS)
    >>> result = tts.synthesize("Hello there.", voice="syn_a", speed=1.0)
    >>> result.audio, result.sample_rate, result.timings        # float32 (n,), 24000, {stage: s}
    >>> for chunk in tts.stream(long_text, voice="syn_a"): ...  # audio as each chunk is ready

The runtime reads ``<model_dir>/manifest.json`` and the packages it lists; all model math runs in
those artifacts, the runtime does orchestration, bucket choice and host DSP only.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import importlib

from anetts.families import declaration
from anetts.runtime.backends import BACKENDS, StageRunner, default_backend, make_backend
from anetts.runtime.errors import ArtifactError, BackendUnavailable, InputError, IntegrityError, TTSError
from anetts.runtime.manifest import ModelArtifacts

DEFAULT_MODEL_DIR = Path("artifacts") / "kokoro-tiny"

__all__ = [
    "BACKENDS",
    "ArtifactError",
    "BackendUnavailable",
    "DEFAULT_MODEL_DIR",
    "InputError",
    "IntegrityError",
    "ModelArtifacts",
    "StageRunner",
    "TTSError",
    "default_backend",
    "load",
]


def load(model_dir: str | Path = DEFAULT_MODEL_DIR, backend: str | None = None, *, threads: int | None = None,
         compute_units: str | Mapping[str, str] | None = None, deployment_target: str | None = None,
         endpoint: str | None = None, cache_dir: str | Path | None = None):
    """Open a built model directory (``artifacts/<model>``) or a published one (``hf://OWNER/REPO@REV``).

    ``hf://`` downloads the variant the backend needs into the Hugging Face cache (``cache_dir``:
    another cache; ``endpoint``: another Hub than ``HF_ENDPOINT``) and verifies every file before use (:mod:`anetts.publish.download`).

    ``backend``: ``"torch"`` (TorchScript exports, any OS; the default off macOS), ``"coreml"``
    (the .mlpackages through Core ML, macOS only; the default there) or ``"mil"`` (the MIL
    reference executor). ``threads`` sets torch's intra-op threads (torch backend);
    ``compute_units`` overrides the manifest's per-stage Core ML compute units (a name for all
    stages, or {stage: name}). Packages are verified (sha256) and loaded on first use. The runtime
    class is the one the manifest's family declares (Kokoro: KokoroRuntime; Fish: FishRuntime, whose
    default off macOS is ``mil``). ``deployment_target``
    (e.g. ``"macOS15"``): the oldest OS the caller supports; from macOS15/iOS18 on each stage runs
    from its multifunction bundle, otherwise (and by default) from per-bucket packages.
    """
    resolves_inside = None
    if isinstance(model_dir, str) and model_dir.startswith("hf://"):
        from anetts.publish.download import fetch

        hub = fetch(model_dir, backend=backend, endpoint=endpoint, cache_dir=cache_dir)
        model_dir, resolves_inside = hub.model_dir, hub.repo_cache  # its files are links into the cache's blobs
    artifacts = ModelArtifacts.load(model_dir, deployment_target=deployment_target, resolves_inside=resolves_inside)
    cls = runtime_class(artifacts.family)  # before the backend loads any package
    # a runtime whose stages need more than StageRunner.run (functions, KV states) brings its own runner
    make = getattr(cls, "make_backend", make_backend)
    runner = make(backend, artifacts, threads=threads, compute_units=compute_units)
    return cls(artifacts, runner)


def runtime_class(family: str):
    """The runtime a family declares (``module:Class``); the manifest's family picks it."""
    decl = declaration(family)
    if decl.runtime is None:
        raise TTSError(f"family {family!r} has no runtime yet: its packages are built and verified, but "
                       f"nothing in anetts synthesizes speech from them")
    module, _, name = decl.runtime.partition(":")
    return getattr(importlib.import_module(module), name)


def __getattr__(name):  # the Kokoro result types, importable from here as before
    if name in ("ChunkResult", "KokoroRuntime", "SynthesisResult"):
        return getattr(importlib.import_module("anetts.models.kokoro.runtime"), name)
    raise AttributeError(name)
