"""The speech request (OpenAI's fields) and what a model makes of it.

A :class:`Speaker` turns a request into audio pieces on one model instance (the pool gives it one),
through the runtime protocol every family keeps (:mod:`anetts.runtime.speech`): ``stream`` with one
chunk per sentence when streaming and the runtime's own chunks otherwise (so a whole response equals
the CLI's audio). What a model can do (blends, cloned voices, word times, speed) its ``capabilities``
say; cloned voices are registered through the API, encoded once, and kept here.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from anetts.runtime.captions import spoken
from anetts.runtime.errors import InputError, TTSError
from anetts.runtime.planned import Planned
from anetts.runtime.speech import Reference
from anetts.serve.config import (
    MAX_BODY_BYTES,
    MAX_INSTRUCTIONS_CHARS,
    MAX_NAME_CHARS,
    MAX_REFERENCES,
    MAX_TRANSCRIPT_CHARS,
    MAX_VOICE_CHARS,
)
from anetts.serve.errors import APIError
from anetts.serve.upload import ClipLimit
from anetts.serve.voices import StoredVoice, StoreFull, VoiceStore

OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")  # accepted as names of the served model


# Every string field is bounded, so nothing a client sends is parsed, kept or echoed at any length:
# `input` by the server's max_input_chars (checked with its own message), the rest here.
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
VoiceSpec = Annotated[str, Field(max_length=MAX_VOICE_CHARS)]


class VoiceRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: VoiceSpec


Base64 = Annotated[str, Field(max_length=MAX_BODY_BYTES * 4 // 3 + 4)]  # the body limit applies first
Transcript = Annotated[str, Field(max_length=MAX_TRANSCRIPT_CHARS)]


class InlineReference(BaseModel):
    """One reference clip sent with a speech request (Fish's own API: ``references: [{audio, text}]``)."""

    model_config = ConfigDict(extra="forbid")
    audio: Base64
    text: Transcript


class SpeechRequest(BaseModel):
    """OpenAI's ``/v1/audio/speech`` body; ``seed`` (the model's noise / sampling draw) is ours, and so are
    the inline references of cloning models: ``references`` (Fish's API) or ``ref_audio`` + ``ref_text``,
    used for this request only (then ``voice`` may be left out)."""

    model_config = ConfigDict(extra="forbid")
    model: Name
    input: str
    voice: VoiceSpec | VoiceRef | None = None
    references: Annotated[list[InlineReference], Field(max_length=MAX_REFERENCES)] | None = None
    ref_audio: Base64 | None = None
    ref_text: Transcript | None = None
    response_format: Name = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] | None = None
    # for instructable models; neither family is one, so it is ignored
    instructions: Annotated[str, Field(max_length=MAX_INSTRUCTIONS_CHARS)] | None = None
    seed: int = Field(0, ge=0, le=2**32 - 1)

    @property
    def voice_id(self) -> str | None:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice

    def inline(self) -> tuple[str, str, str] | None:
        """(field, base64 audio, transcript) of the inline reference, None without one; APIError 400 for
        a half-given or doubly given one."""
        if self.references is not None:
            if self.ref_audio is not None or self.ref_text is not None:
                raise APIError(400, "references and ref_audio/ref_text both given; send one of them",
                               param="references")
            if not self.references:
                raise APIError(400, "references is empty; give one {audio, text} or leave it out", param="references")
            r = self.references[0]
            return "references", r.audio, r.text
        if self.ref_audio is None and self.ref_text is None:
            return None
        if self.ref_audio is None or self.ref_text is None:
            missing = "ref_audio" if self.ref_audio is None else "ref_text"
            raise APIError(400, f"{missing} is required with {'ref_text' if missing == 'ref_audio' else 'ref_audio'}",
                           param=missing)
        return "ref_audio", self.ref_audio, self.ref_text


@dataclass
class Piece:
    """Audio made for one chunk / block, and how far the request has come."""

    audio: np.ndarray  # float32 mono at the model's rate
    input_tokens: int  # tokens of the input consumed by this piece
    output_frames: int  # model frames this piece holds
    words: list[dict] = field(default_factory=list)  # {word, start_time, end_time}, s from the audio's start
    is_last: bool = False  # the request's last piece


# the runtime's names of its inputs (InputError.field) -> this API's
_PARAMS = {"text": "input", "lang": "voice", "reference_text": "text", "reference_audio": "audio_sample",
           "reference_codes": "audio_sample"}


def _bad(param: str, e: InputError, names: dict | None = None) -> APIError:
    """A 400 for a runtime's InputError: about the field it names (``names`` first), else ``param``."""
    field = getattr(e, "field", None)
    return APIError(400, str(e), param={**_PARAMS, **(names or {})}.get(field, field) or param)


class Speaker:
    """One build's speech: its voices (the built ones, and those cloned here when it clones), the
    checks of a request, and its plan as pieces. ``options``: the runtime options the server sets for
    every request (``--max-frames``); one the runtime does not take is refused at start, by name."""

    def __init__(self, model_id: str, first_instance, *, options: dict | None = None,
                 store: VoiceStore | None = None):
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
        self.store = store if store is not None else VoiceStore()

    # ------------------------------------------------------------------ voices

    def voices(self, owner: str | None = None) -> list[str]:
        """The built voices and ``owner``'s cloned ones (ids)."""
        return [*self._built, *(v.id for v in self.store.list(owner))]

    def default_voice(self) -> str:
        return self._default

    def voice(self, model, voice_id: str | None, owner: str | None = None):
        """What the runtime takes for ``voice_id``: ``owner``'s cloned voice's reference (by id or name),
        else the name itself, checked by the runtime (built names, blends); unknown ones (another owner's
        voices among them) are a 400 naming them."""
        if voice_id is None:
            raise APIError(400, "voice is required (or, for a model that clones, an inline reference: "
                                "references or ref_audio + ref_text)", param="voice")
        found = self.store.get(voice_id, owner)
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

    def check_transcript(self, model, text: str, param: str = "text") -> None:
        """The transcript alone within the prompt budget: checked before the clip is decoded."""
        try:
            model.check_voice(text)
        except InputError as e:
            raise _bad(param, e, {"reference_text": param}) from None

    def reference(self, model, text: str, clip: np.ndarray, rate: int, audio_param: str = "audio_sample",
                  text_param: str = "text") -> Reference:
        """A reference clip encoded (once) into what the runtime takes; input errors a 400 naming the
        field sent (``audio_param``, ``text_param``)."""
        try:
            return model.make_voice(text, audio=clip, rate=rate)
        except InputError as e:
            raise _bad(audio_param, e, {"reference_text": text_param, "reference_audio": audio_param,
                                        "reference_codes": audio_param}) from None

    def register(self, model, name: str, text: str, clip: np.ndarray, rate: int, owner: str | None = None,
                 consent: str | None = None) -> StoredVoice:
        """Clone a voice from a reference clip (encoded once) and keep it under a new id, owned by ``owner``."""
        cap_error(self.store.check_room, owner)  # before the encoding: a full store costs no work
        reference = self.reference(model, text, clip, rate)
        model.prepare_voice(reference)  # its prompt's fixed prefix prefilled once, here, not in each request
        return cap_error(self.store.create, name, reference, owner, consent)

    def prepare_voices(self, model) -> int:
        """Prefill the stored voices' fixed prompt prefixes on ``model``, newest first, as far as its cache
        holds them without dropping one: how many are cached."""
        return sum(model.prepare_voice(v.reference, evict=False) for v in self.store.newest())

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

    def check(self, model, req: SpeechRequest, voice=None) -> None:
        """Raise APIError (400, naming the field) for what this model cannot speak; cheap, no synthesis.
        ``voice``: what :meth:`voice` (or an inline reference) gave for the request."""
        if voice is None:
            self.voice(model, req.voice_id)
        if req.speed != 1.0 and not self.capabilities.speed:
            raise APIError(400, f"speed {req.speed:g}: {self.model_id} ({self.family}) has no speaking-rate "
                                "control; only 1.0", param="speed")

    def start(self, model, req: SpeechRequest, streaming: bool, voice=None) -> Planned[Piece]:
        """Plan ``req`` on ``model`` (input errors: APIError 400) and return its pieces, still to make,
        with the planned work (``units``), which the pool checks against the time left. ``voice``: as
        for :meth:`check` (default: the request's voice, looked up without an owner)."""
        if voice is None:
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


def cap_error(fn, *args):
    """``fn(*args)``, a store's StoreFull as a 400 naming the cap."""
    try:
        return fn(*args)
    except StoreFull as e:
        raise APIError(400, str(e), param=e.cap, code="voice_limit_reached") from None
