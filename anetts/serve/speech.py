"""The speech request (OpenAI's fields) and what a model makes of it.

A :class:`Speaker` turns a request into audio pieces on one model instance (the pool gives it one),
through the runtime protocol every family keeps (:mod:`anetts.runtime.speech`): ``stream`` with one
chunk per sentence when streaming and the runtime's own chunks otherwise (so a whole response equals
the CLI's audio). What a model can do (blends, cloned voices, word times, speed) its ``capabilities``
say; cloned voices are registered through the API, encoded once, and kept here.
"""
from __future__ import annotations

import secrets
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from anetts.runtime.captions import spoken
from anetts.runtime.errors import InputError, TTSError
from anetts.runtime.planned import Planned
from anetts.runtime.speech import Reference
from anetts.serve.config import MAX_INSTRUCTIONS_CHARS, MAX_NAME_CHARS, MAX_VOICE_CHARS
from anetts.serve.errors import APIError
from anetts.serve.upload import ClipLimit

OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")  # accepted as names of the served model


# Every string field is bounded, so nothing a client sends is parsed, kept or echoed at any length:
# `input` by the server's max_input_chars (checked with its own message), the rest here.
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
VoiceSpec = Annotated[str, Field(max_length=MAX_VOICE_CHARS)]


class VoiceRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: VoiceSpec


class SpeechRequest(BaseModel):
    """OpenAI's ``/v1/audio/speech`` body; ``seed`` (the model's noise / sampling draw) is ours."""

    model_config = ConfigDict(extra="forbid")
    model: Name
    input: str
    voice: Union[VoiceSpec, VoiceRef]
    response_format: Name = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] | None = None
    # for instructable models; neither family is one, so it is ignored
    instructions: Annotated[str, Field(max_length=MAX_INSTRUCTIONS_CHARS)] | None = None
    seed: int = Field(0, ge=0, le=2**32 - 1)

    @property
    def voice_id(self) -> str:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice


@dataclass
class Piece:
    """Audio made for one chunk / block, and how far the request has come."""

    audio: np.ndarray  # float32 mono at the model's rate
    input_tokens: int  # tokens of the input consumed by this piece
    output_frames: int  # model frames this piece holds
    words: list[dict] = field(default_factory=list)  # {word, start_time, end_time}, s from the audio's start
    is_last: bool = False  # the request's last piece


@dataclass
class ClonedVoice:
    id: str
    name: str
    reference: Reference
    created_at: int


# the runtime's names of its inputs (InputError.field) -> this API's
_PARAMS = {"text": "input", "lang": "voice", "reference_text": "text", "reference_audio": "audio_sample",
           "reference_codes": "audio_sample"}


def _bad(param: str, e: InputError) -> APIError:
    """A 400 for a runtime's InputError: about the field it names, else ``param``."""
    field = getattr(e, "field", None)
    return APIError(400, str(e), param=_PARAMS.get(field, field) or param)


class Speaker:
    """One build's speech: its voices (the built ones, and those cloned here when it clones), the
    checks of a request, and its plan as pieces. ``options``: the runtime options the server sets for
    every request (``--max-frames``); one the runtime does not take is refused at start, by name."""

    def __init__(self, model_id: str, first_instance, *, options: dict | None = None):
        rt = first_instance
        self.model_id, self.family, self.sample_rate = model_id, rt.family, rt.sample_rate
        self.capabilities = rt.capabilities
        self.options = {k: v for k, v in (options or {}).items() if v is not None}
        foreign = [k for k in self.options if k not in rt.options]
        if foreign:
            raise TTSError(f"{', '.join('--' + k.replace('_', '-') for k in foreign)}: not an option of {model_id} "
                           f"({rt.family}); it takes {', '.join(rt.options) or 'none'}")
        if not self.capabilities.audio:
            raise TTSError(f"the {rt.family} build {model_id} makes codes, not audio (no codec stage); build it "
                           "with its codec stage to serve it")
        self._built, self._default = list(rt.voices), rt.default_voice
        self._cloned: dict[str, ClonedVoice] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ voices

    def voices(self) -> list[str]:
        with self._lock:
            return [*self._built, *self._cloned]

    def default_voice(self) -> str:
        return self._default

    def voice(self, model, voice_id: str):
        """What the runtime takes for ``voice_id``: a cloned voice's reference (by id or name), else the
        name itself, checked by the runtime (built names, blends); unknown ones are a 400 naming them."""
        with self._lock:
            found = self._cloned.get(voice_id) or next((v for v in self._cloned.values() if v.name == voice_id), None)
        if found is not None:
            return found.reference
        try:
            model.check_voice_name(voice_id)
        except InputError as e:
            hint = " (register a reference clip with POST /v1/audio/voices)" if self.capabilities.cloning else ""
            raise APIError(400, f"{e}{hint}", param=_PARAMS.get(e.field, e.field) or "voice") from None
        return voice_id

    def reference_limit(self, model) -> ClipLimit:
        return ClipLimit(model.sample_rate, model.max_reference_samples)

    def check_transcript(self, model, text: str) -> None:
        """The transcript alone within the prompt budget: checked before the clip is decoded."""
        try:
            model.check_voice(text)
        except InputError as e:
            raise _bad("text", e) from None

    def register(self, model, name: str, text: str, clip: np.ndarray, rate: int) -> ClonedVoice:
        """Clone a voice from a reference clip (encoded once) and keep it under a new id."""
        try:
            reference = model.make_voice(text, audio=clip, rate=rate)
        except InputError as e:
            raise _bad("audio_sample", e) from None
        voice = ClonedVoice(f"voice_{secrets.token_hex(8)}", name, reference, int(time.time()))
        with self._lock:
            self._cloned[voice.id] = voice
        return voice

    # ------------------------------------------------------------------ speech

    def warmup(self, model) -> list[tuple[int, float]]:
        """Load what a first request needs and time the runtime's warm-up texts: [(planned units, seconds)].
        The first text runs once untimed first: its packages load on first use, and a load counted as
        speech would make the pool's estimate refuse short requests that fit."""
        model.warmup()
        for _ in model.stream(model.warmup_texts[0], **self.options):
            pass
        runs = []
        for t in model.warmup_texts:
            t0 = time.perf_counter()
            chunks = model.stream(t, **self.options)
            for _ in chunks:
                pass
            runs.append((chunks.units, time.perf_counter() - t0))
        return runs

    def check(self, model, req: SpeechRequest) -> None:
        """Raise APIError (400, naming the field) for what this model cannot speak; cheap, no synthesis."""
        self.voice(model, req.voice_id)
        if req.speed != 1.0 and not self.capabilities.speed:
            raise APIError(400, f"speed {req.speed:g}: {self.model_id} ({self.family}) has no speaking-rate "
                                "control; only 1.0", param="speed")

    def start(self, model, req: SpeechRequest, streaming: bool) -> Planned[Piece]:
        """Plan ``req`` on ``model`` (input errors: APIError 400) and return its pieces, still to make,
        with the planned work (``units``), which the pool checks against the time left."""
        voice = self.voice(model, req.voice_id)
        try:  # input errors come from planning (here) or from a chunk too long to split (while making it)
            chunks = model.stream(req.input, voice, req.speed, seed=req.seed, sentences=streaming, **self.options)
        except InputError as e:
            raise _bad("input", e) from None

        def gen():
            try:
                for c in chunks:
                    yield Piece(c.audio, c.input_tokens, c.output_frames, [asdict(w) for w in spoken(c.words)],
                                c.is_last)
            except InputError as e:
                raise _bad("input", e) from None

        return Planned(gen(), chunks.units, chunks.unit)
