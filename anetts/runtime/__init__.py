"""Thin runtime: the built artifacts of a model, run stage by stage.

The runtime reads ``<model_dir>/manifest.json`` (:mod:`anetts.runtime.manifest`) and runs the
packages it lists through one runner per executor (:mod:`anetts.runtime.runners`); all model math
runs in those artifacts, a family's runtime class (``anetts.models.<family>.runtime``) does the
orchestration, bucket choice and host DSP. Open a model with :func:`anetts.load`
(:mod:`anetts.loader`): this package knows no family and no Hub.
"""
from __future__ import annotations

from anetts.runtime.errors import ArtifactError, BackendUnavailable, InputError, IntegrityError, TTSError
from anetts.runtime.manifest import ModelArtifacts
from anetts.runtime.runners import EXECUTORS, Runner, default_executor

__all__ = [
    "EXECUTORS",
    "ArtifactError",
    "BackendUnavailable",
    "InputError",
    "IntegrityError",
    "ModelArtifacts",
    "Runner",
    "TTSError",
    "default_executor",
]
