"""The speech request (OpenAI's fields) and what each model family makes of it.

A :class:`Speaker` turns a request into audio pieces on one model instance (the pool gives it one):
Kokoro through ``KokoroRuntime.stream`` (one chunk per sentence when streaming, upstream's packed
chunks otherwise, so a whole response equals the CLI's audio), Fish through ``FishRuntime.stream``
(blocks of frames; voices are reference clips registered through the API, encoded once).
"""
from __future__ import annotations

import secrets
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from anetts.models.kokoro.timestamps import spoken
from anetts.runtime.errors import InputError
from anetts.runtime.planned import Planned
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


class Speaker:
    family: str
    sample_rate: int
    clones = False
    timestamps = False

    def __init__(self, model_id: str, first_instance):
        self.model_id = model_id
        self.sample_rate = first_instance.sample_rate

    def warmup(self, model) -> list[tuple[int, float]]:
        """Load what a first request needs and time short runs: [(planned units, seconds)]."""
        raise NotImplementedError

    def voices(self) -> list[str]:
        raise NotImplementedError

    def default_voice(self) -> str:
        raise NotImplementedError

    def check(self, model, req: SpeechRequest) -> None:
        """Raise APIError (400, naming the field) for what this family cannot speak; cheap, no synthesis."""

    def start(self, model, req: SpeechRequest, streaming: bool) -> Planned[Piece]:
        """Plan ``req`` on ``model`` (input errors: APIError 400) and return its pieces, still to make,
        with the planned work (``units``), which the pool checks against the time left."""
        raise NotImplementedError


def _pieces(chunks: Planned, piece) -> Planned[Piece]:
    """``chunks`` as Pieces (``piece(chunk)``); an InputError while making them is a 400 about the input."""

    def gen():
        try:
            for c in chunks:
                yield piece(c)
        except InputError as e:
            raise _bad("input", e) from None

    return Planned(gen(), chunks.units, chunks.unit)


# the runtime's names of its inputs (InputError.field) -> this API's
_PARAMS = {"text": "input", "lang": "voice", "reference_text": "text", "reference_audio": "audio_sample",
           "reference_codes": "audio_sample"}


def _bad(param: str, e: InputError) -> APIError:
    """A 400 for a runtime's InputError: about the field it names, else ``param``."""
    field = getattr(e, "field", None)
    return APIError(400, str(e), param=_PARAMS.get(field, field) or param)


class KokoroSpeaker(Speaker):
    family = "kokoro"
    timestamps = True  # where the language has words (the frontend's); empty for the others

    def __init__(self, model_id, first_instance):
        super().__init__(model_id, first_instance)
        self._voices = list(first_instance.voices)
        self._default = first_instance.default_voice

    def voices(self):
        return list(self._voices)

    def default_voice(self):
        return self._default

    def warmup(self, model):
        from anetts.models.kokoro.frontend import SAMPLE_TEXTS, frontend

        model.warmup()
        text = SAMPLE_TEXTS[frontend(None, self._default, model.voice_languages).code]
        runs = []
        for t in (text, " ".join([text] * 3)):  # two lengths: the estimate is a line
            t0 = time.perf_counter()
            chunks = model.stream(t, voice=self._default)
            for _ in chunks:
                pass
            runs.append((chunks.units, time.perf_counter() - t0))
        return runs

    def check(self, model, req):
        try:
            model.voice_pack(req.voice_id)  # names and blends: unknown names / bad weights are named
        except InputError as e:
            raise _bad("voice", e) from None

    def start(self, model, req, streaming):
        try:  # input errors come from planning (here) or from a chunk too long to split (while making it)
            chunks = model.stream(req.input, voice=req.voice_id, speed=req.speed, seed=req.seed, sentences=streaming)
        except InputError as e:
            raise _bad("input", e) from None
        return _pieces(chunks, lambda c: Piece(c.audio, len(c.input_ids), c.frames,
                                               [asdict(w) for w in spoken(c.words)]))


@dataclass
class ClonedVoice:
    id: str
    name: str
    text: str
    codes: np.ndarray  # (10, frames) of the reference clip
    created_at: int


class FishSpeaker(Speaker):
    """Fish S2: the voice ``default`` (no reference) or one registered with :meth:`register`."""

    family = "fish"
    clones = True
    DEFAULT = "default"

    def __init__(self, model_id, first_instance, max_frames: int | None = None):
        super().__init__(model_id, first_instance)
        if not first_instance.has_codec:
            raise APIError(500, f"the Fish build {model_id} has no codec stage, so it makes codes, not audio; "
                                "build it with its codec stage to serve it", type="server_error")
        self.max_frames = max_frames
        self._registered: dict[str, ClonedVoice] = {}
        self._lock = threading.Lock()

    def voices(self):
        with self._lock:
            return [self.DEFAULT, *self._registered]

    def default_voice(self):
        return self.DEFAULT

    def voice(self, voice_id: str) -> ClonedVoice | None:
        if voice_id == self.DEFAULT:
            return None
        with self._lock:
            found = self._registered.get(voice_id) or next(
                (v for v in self._registered.values() if v.name == voice_id), None)
        if found is None:
            raise APIError(400, f"unknown voice {voice_id!r}; available: {self.voices()} (register a reference "
                                "clip with POST /v1/audio/voices)", param="voice", code="voice_not_found")
        return found

    WARMUP_TEXT = "Hello there. This is a warm-up."

    def warmup(self, model):
        model.warmup()
        t0 = time.perf_counter()
        chunks = model.stream(self.WARMUP_TEXT, seed=0, max_frames=self.max_frames)
        for _ in chunks:
            pass
        return [(chunks.units, time.perf_counter() - t0)]

    def reference_limit(self, model) -> ClipLimit:
        return ClipLimit(model.sample_rate, model.max_reference_samples)

    def check(self, model, req):
        self.voice(req.voice_id)
        if req.speed != 1.0:
            raise APIError(400, f"speed {req.speed:g}: Fish S2 has no speaking-rate control; only 1.0",
                           param="speed")

    def check_transcript(self, model, text: str) -> None:
        """The transcript alone within the prompt budget: checked before the clip is decoded."""
        try:
            model.check_voice(text)
        except InputError as e:
            raise _bad("text", e) from None

    def register(self, model, name: str, text: str, clip: np.ndarray, rate: int) -> ClonedVoice:
        """Encode a reference clip once (upstream's codec encoder) and keep its codes under a new id, once
        the transcript and the codes together leave the prompt room for speech."""
        try:
            codes = model.encode_reference(clip, rate)
            text, codes = model.check_voice(text, codes)
        except InputError as e:
            raise _bad("audio_sample", e) from None
        voice = ClonedVoice(f"voice_{secrets.token_hex(8)}", name, text, codes, int(time.time()))
        with self._lock:
            self._registered[voice.id] = voice
        return voice

    def start(self, model, req, streaming):
        voice = self.voice(req.voice_id)
        ref_text, ref_codes = (voice.text, voice.codes) if voice else (None, None)
        try:
            blocks = model.stream(req.input, reference_text=ref_text, reference_codes=ref_codes, seed=req.seed,
                                  max_frames=self.max_frames)
        except InputError as e:
            raise _bad("input", e) from None
        tokens = len(model.tokenizer.encode(req.input, add_special_tokens=False).ids)
        return _pieces(blocks, lambda b: Piece(b.audio, tokens if b.is_last else 0, len(b.codes)))


def speaker_for(model_id: str, first_instance, *, max_frames: int | None = None) -> Speaker:
    family = getattr(first_instance, "family", "kokoro")
    if family == "fish":
        return FishSpeaker(model_id, first_instance, max_frames=max_frames)
    return KokoroSpeaker(model_id, first_instance)
