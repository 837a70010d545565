"""The FastAPI application: OpenAI's speech endpoints over the model instances of one build.

What a request must pass before its body is read (host, origin, key, size) is :mod:`anetts.serve.guard`;
how many requests run and wait, and for how long, is :mod:`anetts.serve.pool`.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path

import numpy as np
from fastapi import FastAPI, File, Form, Request, UploadFile
from fastapi.responses import HTMLResponse, Response, StreamingResponse

from anetts._version import __version__
from anetts.runtime.errors import InputError, TTSError, check_text_unicode
from anetts.serve import guard
from anetts.serve.encode import FormatError, StreamEncoder, check_format, encode
from anetts.serve.errors import APIError, error_body, install
from anetts.serve.config import MAX_NAME_CHARS, MAX_TRANSCRIPT_CHARS, ServeConfig
from anetts.serve.pool import Busy, ClientGone, ModelPool, Slot, TimedOut, TooLong
from anetts.serve.speech import OPENAI_MODELS, Speaker, SpeechRequest, cap_error
from anetts.serve.upload import ClipError, ClipReader, read_clip
from anetts.serve.voices import ID_PATTERN, VoiceStore

log = logging.getLogger("anetts.serve")


class SlotResponse(StreamingResponse):
    """A streamed response that gives its model instance back however it ends (done, client gone)."""

    def __init__(self, content, slot: Slot, **kw):
        super().__init__(content, **kw)
        self.slot = slot

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()


class StreamCut(Exception):
    """Raised out of a streamed audio body that cannot be completed: the server then aborts the
    connection, so the client sees the body end without its last chunk instead of a complete file."""


class _QuietStreamCut(logging.Filter):
    # the cut is logged once, as a warning, where it happens; uvicorn would add a traceback
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], StreamCut))


def _quiet_stream_cuts() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _QuietStreamCut) for f in logger.filters):
        logger.addFilter(_QuietStreamCut())


def _share_prefix_cache(instances: list, mb: int | None, model_id: str) -> None:
    """One cache of prefilled voice prompts for every worker (`mb`: its cap; None: the runtime's default)."""
    first = instances[0]
    if not hasattr(first, "share_prefix_cache"):
        if mb is not None:
            raise TTSError(f"--prefix-cache-mb: not an option of {model_id} ({first.family}); only Fish builds keep "
                           "prefilled voice prompts")
        return
    if mb is not None:
        try:
            first.set_prefix_cache_mb(mb)
        except InputError as e:
            raise TTSError(f"--prefix-cache-mb: {e}") from None
    for inst in instances[1:]:
        inst.share_prefix_cache(first.prefix_cache)


def _page() -> str:
    return resources.files("anetts.serve").joinpath("page.html").read_text(encoding="utf-8")


def create_app(config: ServeConfig, instances: list | None = None) -> FastAPI:
    """The app over ``instances`` (default: ``config.workers`` fresh loads of ``config.model_dir``)."""
    from anetts.loader import load

    if instances is None:
        instances = [load(config.model_dir, backend=config.backend, threads=config.threads)
                     for _ in range(config.workers)]
    first = instances[0]
    model_id = first.artifacts.manifest.get("model") or Path(config.model_dir).name
    _share_prefix_cache(instances, config.prefix_cache_mb, model_id)
    store = VoiceStore(config.voice_dir, max_per_owner=config.max_voices, max_bytes=config.max_voice_bytes)
    speaker = Speaker(model_id, first, options={"max_frames": config.max_frames}, store=store)
    if first.capabilities.cloning:
        if store.persistent:
            log.warning("cloned voices are kept in %s (%d loaded, %d files refused)", store.directory, len(store),
                        len(store.refused))
        else:
            log.warning("cloned voices are kept in memory only (no --voice-dir): they are gone when the server stops")
    if not config.api_keys:
        log.warning("no API keys: a single-user server; every client sees, uses and deletes every cloned voice")
    if first.capabilities.cloning and len(store):  # into the cache every worker shares
        log.info("prefilled the prompts of %d of %d stored voices", speaker.prepare_voices(first), len(store))
    pool = ModelPool(instances, config.queue, config.timeout)
    for inst in instances:  # the G2P and the smallest buckets, timed: the pool's first speed estimate
        pool.calibrate(speaker.warmup(inst))

    _quiet_stream_cuts()
    clips = ClipReader()  # uploads are decoded in a child process, started on the first one

    @asynccontextmanager
    async def lifespan(_app):
        yield
        clips.close()

    app = FastAPI(title="ane-tts", version=__version__, docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.pool, app.state.speaker, app.state.config = pool, speaker, config
    install(app)
    # added innermost first: BodyLimit runs last, ErrorBoundary first (guard's docstring has the order)
    app.add_middleware(guard.BodyLimit, limit=config.max_body_bytes)
    app.add_middleware(guard.KeyCheck, keys=tuple(config.api_keys))
    app.add_middleware(guard.WriteOrigin, cors_origins=config.cors_origins)
    if config.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=config.cors_origins, allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(guard.HostCheck, hosts=guard.allowed_hosts(config.host, config.allowed_hosts))
    app.add_middleware(guard.ErrorBoundary)

    async def held(request: Request) -> Slot:
        """A model instance for this request, within its timeout (waiting included)."""
        try:
            return await pool.acquire(time.monotonic() + pool.timeout, request.receive)
        except Busy as e:
            raise APIError(429, str(e), code="rate_limit_exceeded", type="rate_limit_error",
                           headers={"Retry-After": str(e.retry_after)}) from None
        except TimedOut as e:
            raise APIError(503, str(e), code="timeout", type="server_error",
                           headers={"Retry-After": str(pool.retry_after())}) from None
        except ClientGone as e:  # nobody reads the answer; 499 is what the log shows
            raise APIError(499, str(e), code="client_closed_request") from None

    def owner_of(request: Request) -> str | None:
        """The owner id guard.KeyCheck found for the request's key; None on a server without keys."""
        return (request.scope.get("state") or {}).get("owner")

    async def decoded_clip(slot: Slot, data: bytes, filename: str | None, param: str, what: str):
        """(clip, rate) of uploaded bytes, read in the child process within this model's clip limit."""
        try:  # header first, decode bounded by it, in a child process (anetts.serve.upload)
            return await clips.call(read_clip, data, filename, speaker.reference_limit(slot.model), param,
                                    what=what)
        except ClipError as e:
            raise APIError(400, str(e), param=param) from None

    async def voice_for(slot: Slot, req: SpeechRequest, request: Request):
        """What the runtime takes as the request's voice: the inline reference, encoded for this request
        only (nothing is kept), else the voice named, among the built ones and the caller's own."""
        inline = req.inline()
        if inline is None:
            return await slot.call(speaker.voice, slot.model, req.voice_id, owner_of(request))
        param, audio_b64, text = inline
        text_param = "references" if param == "references" else "ref_text"
        if not speaker.capabilities.cloning:
            raise APIError(400, f"{param}: {model_id} ({speaker.family}) does not clone voices; its voices are the "
                                "built ones (GET /v1/audio/voices)", param=param)
        if req.voice_id is not None and req.voice_id != speaker.default_voice():
            raise APIError(400, f"voice {req.voice_id[:80]!r} and an inline reference ({param}): give one of them",
                           param="voice")
        if not text.strip():
            raise APIError(400, f"{text_param}: the transcript of the reference clip is empty", param=text_param)
        try:
            data = base64.b64decode(audio_b64, validate=True)
        except (binascii.Error, ValueError):
            raise APIError(400, f"{param}: the audio is not base64", param=param) from None
        await slot.call(speaker.check_transcript, slot.model, text, text_param)
        clip, rate = await decoded_clip(slot, data, None, param, f"the {param} audio")
        return await slot.call(speaker.reference, slot.model, text, clip, rate, param, text_param)

    async def planned(slot: Slot, req: SpeechRequest, streaming: bool, request: Request):
        """``req`` planned on the slot's instance, its work checked against the time the request has."""
        voice = await voice_for(slot, req, request)
        await slot.call(speaker.check, slot.model, req, voice)
        chunks = await slot.call(speaker.start, slot.model, req, streaming, voice)
        try:
            slot.fits(chunks)
        except TooLong as e:
            raise APIError(400, str(e), param="input", code="input_too_long_for_timeout") from None
        except TimedOut as e:
            raise APIError(503, str(e), code="timeout", type="server_error",
                           headers={"Retry-After": str(pool.retry_after())}) from None
        return chunks

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        return _page()

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_id, "family": speaker.family, "sample_rate": speaker.sample_rate,
                "backend": first.backend.name, "workers": len(pool.instances), "busy": pool.busy,
                "queued": pool.waiting, "queue": pool.queue_limit}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": 0, "owned_by": "ane-tts"}]}

    @app.get("/v1/audio/voices")
    async def voices(request: Request):
        caps, owner = speaker.capabilities, owner_of(request)
        return {"voices": speaker.voices(owner), "default": speaker.default_voice(), "family": speaker.family,
                "blending": caps.blending, "cloning": caps.cloning, "timestamps": caps.timestamps, "speed": caps.speed,
                "object": "list", "data": [v.public() for v in store.list(owner)]}

    def not_found(voice_id: str) -> APIError:
        return APIError(404, f"no voice {voice_id[:80]!r} here", param="voice_id", code="voice_not_found",
                        type="not_found_error")

    @app.get("/v1/audio/voices/{voice_id}")
    async def get_voice(voice_id: str, request: Request):
        v = store.get(voice_id, owner_of(request)) if ID_PATTERN.fullmatch(voice_id) else None
        if v is None:  # another owner's voice is one that does not exist
            raise not_found(voice_id)
        return v.public()

    @app.delete("/v1/audio/voices/{voice_id}")
    async def delete_voice(voice_id: str, request: Request):
        if not (ID_PATTERN.fullmatch(voice_id)
                and await asyncio.to_thread(store.delete, voice_id, owner_of(request))):
            raise not_found(voice_id)
        return {"id": voice_id, "object": "audio.voice", "deleted": True}

    @app.post("/v1/audio/voices")
    async def register_voice(request: Request, audio_sample: UploadFile = File(...),
                             name: str = Form(..., max_length=MAX_NAME_CHARS),
                             text: str = Form(..., max_length=MAX_TRANSCRIPT_CHARS),
                             consent: str | None = Form(None, max_length=MAX_TRANSCRIPT_CHARS),
                             kind: str = Form("audio_sample", alias="type", max_length=MAX_NAME_CHARS)):
        if not speaker.capabilities.cloning:
            raise APIError(400, f"{model_id} ({speaker.family}) does not clone voices; its voices are the built ones "
                                "(GET /v1/audio/voices)", param="audio_sample")
        if kind != "audio_sample":
            raise APIError(400, f"type {kind[:40]!r}: only 'audio_sample' voices can be made here", param="type")
        if not text.strip():
            raise APIError(400, "text (the transcript of the reference clip) is empty", param="text")
        if not name.strip():
            raise APIError(400, "name is empty", param="name")
        owner = owner_of(request)
        cap_error(store.check_room, owner)  # a full store is said before the upload is read or encoded
        slot = await held(request)
        try:
            await slot.call(speaker.check_transcript, slot.model, text)
            data = await audio_sample.read()  # at most the body limit
            clip, rate = await decoded_clip(slot, data, audio_sample.filename, "audio_sample",
                                            f"audio_sample {str(audio_sample.filename)[:80]!r}")
            voice = await slot.call(speaker.register, slot.model, name, text, clip, rate, owner, consent)
        except TimedOut as e:
            raise APIError(504, str(e), code="timeout", type="server_error") from None
        finally:
            slot.release()
        return {"id": voice.id, "object": "audio.voice", "name": voice.name, "created_at": voice.created_at,
                "type": "audio_sample", "frames": int(voice.reference.codes.shape[1])}

    def check_request(req: SpeechRequest, streaming: bool):
        if req.model not in (model_id, *OPENAI_MODELS):
            raise APIError(404, f"model {req.model!r} is not served here; this server speaks {model_id!r} "
                                f"(also accepted as {list(OPENAI_MODELS)})", param="model", code="model_not_found",
                           type="not_found_error")
        if len(req.input) > config.max_input_chars:
            raise APIError(400, f"input is {len(req.input)} characters, more than the limit of "
                                f"{config.max_input_chars}", param="input", code="string_above_max_length")
        if not req.input.strip():
            raise APIError(400, "input is empty or whitespace only; nothing to speak", param="input")
        try:
            check_text_unicode(req.input, "input")
        except InputError as e:
            raise APIError(400, str(e), param="input") from None
        try:
            return check_format(req.response_format, speaker.sample_rate, streaming)
        except FormatError as e:
            raise APIError(400, str(e), param="response_format") from None

    async def whole(request: Request, req: SpeechRequest, fmt) -> tuple[bytes, list[dict]]:
        """The whole response's bytes and words, with upstream's chunking (as the CLI)."""
        slot = await held(request)
        try:
            chunks = await planned(slot, req, False, request)
            pieces = [p async for p in slot.steps(lambda: chunks, stop=request.is_disconnected)]
        except TimedOut as e:
            raise APIError(504, str(e), code="timeout", type="server_error") from None
        except ClientGone as e:
            raise APIError(499, str(e), code="client_closed_request") from None
        finally:
            slot.release()
        audio = np.concatenate([p.audio for p in pieces]) if pieces else np.zeros(0, np.float32)
        body = await asyncio.to_thread(encode, audio, speaker.sample_rate, fmt)
        return body, [w for p in pieces for w in p.words]

    @app.post("/v1/audio/captioned_speech")
    async def captioned_speech(req: SpeechRequest, request: Request):
        """Kokoro-FastAPI's captioned speech: the whole audio (base64) and its words' times."""
        if not speaker.capabilities.timestamps:
            raise APIError(400, f"{model_id} ({speaker.family}) gives no word timestamps", param="model")
        if req.stream_format is not None:
            raise APIError(400, "captioned speech is one JSON answer; for words while streaming, use "
                                "/v1/audio/speech with stream_format 'sse' (its deltas carry them)", param="stream_format")
        fmt = check_request(req, False)
        body, words = await whole(request, req, fmt)
        return {"audio": base64.b64encode(body).decode(), "audio_format": fmt.name,
                "sample_rate": speaker.sample_rate, "timestamps": words}

    @app.post("/v1/audio/speech")
    async def speech(req: SpeechRequest, request: Request):
        streaming = req.stream_format is not None
        fmt = check_request(req, streaming)
        if not streaming:
            body, _ = await whole(request, req, fmt)
            return Response(body, media_type=fmt.media_type)

        slot = await held(request)
        try:
            chunks = await planned(slot, req, True, request)
            pieces = slot.steps(lambda: chunks)
            first_piece = await anext(pieces)  # input errors surface here, before any header is sent
        except TimedOut as e:
            slot.release()
            raise APIError(504, str(e), code="timeout", type="server_error") from None
        except BaseException:
            slot.release()
            raise

        async def audio_bytes():
            enc = StreamEncoder(fmt, speaker.sample_rate)
            yield enc.feed(first_piece.audio)
            try:
                async for p in pieces:
                    yield enc.feed(p.audio)
            except (TimedOut, APIError) as e:  # the status is sent: abort, so the client sees a cut body
                log.warning("streamed request cut short, connection aborted: %s", e)
                raise StreamCut(str(e)) from None
            yield enc.close()

        async def events():
            enc = StreamEncoder(fmt, speaker.sample_rate)
            n_in = n_out = 0

            def delta(p, data: bytes) -> str:
                nonlocal n_in, n_out
                n_in, n_out = n_in + p.input_tokens, n_out + p.output_frames
                event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
                if p.words:  # ours: the words of this delta's audio, in seconds from the start
                    event["words"] = p.words
                return _sse(event)

            yield delta(first_piece, enc.feed(first_piece.audio))
            try:
                async for p in pieces:
                    yield delta(p, enc.feed(p.audio))
            except (TimedOut, APIError) as e:  # the status is sent: say it in the stream
                log.warning("streamed request cut short: %s", e)
                status, kind = (504, "server_error") if isinstance(e, TimedOut) else (e.status, e.type)
                yield _sse({"type": "error", **error_body(str(e), kind, getattr(e, "param", None), str(status))})
                return
            tail = enc.close()
            if tail:
                yield _sse({"type": "speech.audio.delta", "audio": base64.b64encode(tail).decode()})
            yield _sse({"type": "speech.audio.done",
                        "usage": {"input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out}})

        if req.stream_format == "sse":
            return SlotResponse(events(), slot, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return SlotResponse(audio_bytes(), slot, media_type=fmt.media_type)

    return app


def _sse(event: dict) -> str:
    return f"data: {json.dumps(event)}\n\n"

