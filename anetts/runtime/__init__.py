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

from anetts.runtime.backends import BACKENDS, StageRunner, default_backend, make_backend
from anetts.runtime.errors import ArtifactError, BackendUnavailable, InputError, IntegrityError, TTSError
from anetts.runtime.kokoro import ChunkResult, KokoroRuntime, SynthesisResult
from anetts.runtime.manifest import ModelArtifacts

DEFAULT_MODEL_DIR = Path("artifacts") / "kokoro-tiny"

__all__ = [
    "BACKENDS",
    "ArtifactError",
    "BackendUnavailable",
    "ChunkResult",
    "DEFAULT_MODEL_DIR",
    "InputError",
    "IntegrityError",
    "KokoroRuntime",
    "ModelArtifacts",
    "StageRunner",
    "SynthesisResult",
    "TTSError",
    "default_backend",
    "load",
]


def load(model_dir: str | Path = DEFAULT_MODEL_DIR, backend: str | None = None, *, threads: int | None = None,
         compute_units: str | Mapping[str, str] | None = None, endpoint: str | None = None,
         cache_dir: str | Path | None = None) -> KokoroRuntime:
    """Open a built model directory (``artifacts/<model>``) or a published one (``hf://OWNER/REPO@REV``).

    ``hf://`` downloads the variant the backend needs into the Hugging Face cache (``cache_dir``:
    another cache; ``endpoint``: another Hub than ``HF_ENDPOINT``) and verifies every file before use (:mod:`anetts.publish.download`).

    ``backend``: ``"torch"`` (TorchScript exports, any OS; the default off macOS), ``"coreml"``
    (the .mlpackages through Core ML, macOS only; the default there) or ``"mil"`` (the MIL
    reference executor). ``threads`` sets torch's intra-op threads (torch backend);
    ``compute_units`` overrides the manifest's per-stage Core ML compute units (a name for all
    stages, or {stage: name}). Packages are verified (sha256) and loaded on first use.
    """
    if isinstance(model_dir, str) and model_dir.startswith("hf://"):
        from anetts.publish.download import fetch

        model_dir = fetch(model_dir, backend=backend, endpoint=endpoint, cache_dir=cache_dir).model_dir
    artifacts = ModelArtifacts.load(model_dir)
    runner = make_backend(backend, artifacts, threads=threads, compute_units=compute_units)
    return KokoroRuntime(artifacts, runner)
