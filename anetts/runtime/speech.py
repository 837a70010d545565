"""What every family's runtime offers its callers: the CLI, the server, the benchmarks.

A runtime (what :func:`anetts.load` returns) says what it is and what it can do, and speaks through
one call::

    family, sample_rate, voices, default_voice, capabilities, options, warmup_texts
    stream(text, voice=None, speed=1.0, *, seed=0, sentences=False, **options) -> Planned[chunk]
    make_voice(text, *, audio=None, rate=None, codes=None) -> Reference   (capabilities.cloning)

Every chunk ``stream`` yields has ``audio`` (float32 mono at ``sample_rate``; None where the build
makes codes only), ``words`` (:class:`~anetts.runtime.captions.WordTimestamp`, seconds from the start
of the whole output; empty without ``capabilities.timestamps``), ``codes`` (the model's discrete
output, or None), ``units`` (how much of the planned work it was: ``Planned.unit``), ``input_tokens``,
``output_frames``, ``timings`` and ``is_last``. ``options`` names the keyword arguments of ``stream``
beyond the common ones; the CLI and the server refuse any other by name instead of dropping it.
A family's richer calls (Kokoro's ``synthesize``, Fish's ``generate_codes`` ...) stay its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from anetts.runtime.captions import WordTimestamp
from anetts.runtime.planned import Planned

# the arguments every runtime's `stream` takes; `options` adds the family's own
COMMON_ARGUMENTS = ("voice", "speed", "seed", "sentences")


@dataclass(frozen=True)
class Capabilities:
    """What a runtime can do beyond speaking text in its built voices."""

    blending: bool  # a voice may be a weighted mix of built voices: "a(0.7)+b(0.3)"
    cloning: bool  # voices from a reference clip and its transcript (make_voice)
    timestamps: bool  # chunks carry their words' times
    speed: bool  # a speaking rate other than 1
    audio: bool  # chunks carry audio (a Fish build without its codec stage makes codes only)


@dataclass(frozen=True)
class Reference:
    """A cloned voice as a runtime takes it: the reference clip's transcript and its codes."""

    text: str
    codes: np.ndarray  # (codebooks, frames) int


@runtime_checkable
class SpeechChunk(Protocol):
    audio: np.ndarray | None
    words: Sequence[WordTimestamp]
    codes: np.ndarray | None
    units: int
    input_tokens: int
    output_frames: int
    timings: dict | None
    is_last: bool


@runtime_checkable
class SpeechRuntime(Protocol):
    family: str
    sample_rate: int
    capabilities: Capabilities
    options: tuple[str, ...]

    @property
    def voices(self) -> list[str]: ...

    @property
    def default_voice(self) -> str: ...

    @property
    def warmup_texts(self) -> tuple[str, ...]: ...

    def warmup(self) -> None: ...

    def check_voice_name(self, voice: str) -> None: ...

    def stream(self, text: str, voice=None, speed: float = 1.0, *, seed: int = 0, sentences: bool = False,
               **options) -> Planned[SpeechChunk]: ...
