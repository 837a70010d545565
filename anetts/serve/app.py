"""The FastAPI application: OpenAI's speech endpoints over the model instances of one build."""
from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
from fastapi import Depends, FastAPI, File, Form, HTTPException, Request, UploadFile
from fastapi.responses import HTMLResponse, Response, StreamingResponse

from anetts._version import __version__
from anetts.serve.encode import FormatError, StreamEncoder, check_format, encode
from anetts.serve.errors import APIError, error_body, install
from anetts.serve.pool import Busy, ModelPool, Slot, TimedOut
from anetts.serve.speech import MAX_INPUT_CHARS, OPENAI_MODELS, Speaker, SpeechRequest, speaker_for

log = logging.getLogger("anetts.serve")


@dataclass
class ServeConfig:
    model_dir: Path
    backend: str | None = None
    workers: int = 1
    queue: int = 8  # requests that may wait for a worker; more get 429
    timeout: float = 120.0  # seconds per request, waiting included
    api_key: str | None = None
    cors_origins: list[str] = field(default_factory=list)
    max_body_bytes: int = 16 << 20  # a 30 s reference clip as 44.1 kHz float wav is ~5 MB
    max_input_chars: int = MAX_INPUT_CHARS
    max_frames: int | None = None  # Fish: most frames per text chunk
    threads: int | None = None


class _BodyTooLarge(HTTPException):
    pass


class BodyLimit:
    """Requests whose body is larger than ``limit`` bytes get a 413, declared or not."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    def _error(self, size: str) -> str:
        return f"the request body is {size}, more than this server's limit of {self.limit} bytes"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            body = json.dumps(error_body(self._error(f"{int(declared)} bytes"), "invalid_request_error",
                                         "body", "body_too_large")).encode()
            await send({"type": "http.response.start", "status": 413,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooLarge(413, self._error(f"over {self.limit} bytes"))
            return message

        await self.app(scope, limited, send)


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


def _page() -> str:
    return resources.files("anetts.serve").joinpath("page.html").read_text(encoding="utf-8")


def create_app(config: ServeConfig, instances: list | None = None) -> FastAPI:
    """The app over ``instances`` (default: ``config.workers`` fresh loads of ``config.model_dir``)."""
    from anetts.loader import load

    if instances is None:
        instances = [load(config.model_dir, backend=config.backend, threads=config.threads)
                     for _ in range(config.workers)]
        for inst in instances:
            inst.warmup()
    first = instances[0]
    model_id = first.artifacts.manifest.get("model") or Path(config.model_dir).name
    speaker: Speaker = speaker_for(model_id, first, max_frames=config.max_frames)
    pool = ModelPool(instances, config.queue, config.timeout)

    app = FastAPI(title="ane-tts", version=__version__, docs_url=None, redoc_url=None)
    app.state.pool, app.state.speaker, app.state.config = pool, speaker, config
    install(app)
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    if config.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=config.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])

    def authorized(request: Request) -> None:
        if config.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), config.api_key.encode()):
            raise APIError(401, "missing or wrong API key: send it as 'Authorization: Bearer <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    v1 = [Depends(authorized)]

    async def held(deadline: float) -> Slot:
        try:
            return await pool.acquire(deadline)
        except Busy as e:
            raise APIError(429, str(e), code="rate_limit_exceeded", type="rate_limit_error",
                           headers={"Retry-After": str(e.retry_after)}) from None
        except TimedOut as e:
            raise APIError(503, str(e), code="timeout", type="server_error",
                           headers={"Retry-After": str(pool.retry_after())}) from None

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        return _page()

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_id, "family": speaker.family, "sample_rate": speaker.sample_rate,
                "backend": first.backend.name, "workers": len(pool.instances), "busy": pool.busy,
                "queued": pool.waiting, "queue": pool.queue_limit}

    @app.get("/v1/models", dependencies=v1)
    async def models():
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": 0, "owned_by": "ane-tts"}]}

    @app.get("/v1/audio/voices", dependencies=v1)
    async def voices():
        return {"voices": speaker.voices(), "default": speaker.default_voice(), "family": speaker.family,
                "blending": speaker.family == "kokoro", "cloning": speaker.clones, "timestamps": speaker.timestamps}

    @app.post("/v1/audio/voices", dependencies=v1)
    async def register_voice(audio_sample: UploadFile = File(...), name: str = Form(...), text: str = Form(...),
                             consent: str | None = Form(None), kind: str = Form("audio_sample", alias="type")):
        if not speaker.clones:
            raise APIError(400, f"voice cloning needs a Fish model; this server speaks {model_id} ({speaker.family}), "
                                "whose voices are the built ones (GET /v1/audio/voices)", param="audio_sample")
        if kind != "audio_sample":
            raise APIError(400, f"type {kind!r}: only 'audio_sample' voices can be made here", param="type")
        if not text.strip():
            raise APIError(400, "text (the transcript of the reference clip) is empty", param="text")
        import soundfile as sf

        data = await audio_sample.read()
        try:
            clip, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=False)
        except (RuntimeError, ValueError) as e:  # soundfile's LibsndfileError is a RuntimeError
            raise APIError(400, f"audio_sample {audio_sample.filename!r} is not audio soundfile can read: {e}",
                           param="audio_sample") from None
        slot = await held(time.monotonic() + pool.timeout)
        try:
            voice = await slot.call(speaker.register, slot.model, name, text, clip, rate)
        finally:
            slot.release()
        return {"id": voice.id, "object": "audio.voice", "name": voice.name, "created_at": voice.created_at,
                "type": "audio_sample", "frames": int(voice.codes.shape[1])}

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
            return check_format(req.response_format, speaker.sample_rate, streaming)
        except FormatError as e:
            raise APIError(400, str(e), param="response_format") from None

    async def whole(req: SpeechRequest, fmt) -> tuple[bytes, list[dict]]:
        """The whole response's bytes and words, with upstream's chunking (as the CLI)."""
        slot = await held(time.monotonic() + pool.timeout)
        try:
            await slot.call(speaker.check, slot.model, req)
            pieces = [p async for p in slot.steps(lambda: speaker.pieces(slot.model, req, False))]
        except TimedOut as e:
            raise APIError(504, str(e), code="timeout", type="server_error") from None
        finally:
            slot.release()
        audio = np.concatenate([p.audio for p in pieces]) if pieces else np.zeros(0, np.float32)
        body = await asyncio.to_thread(encode, audio, speaker.sample_rate, fmt)
        return body, [w for p in pieces for w in p.words]

    @app.post("/v1/audio/captioned_speech", dependencies=v1)
    async def captioned_speech(req: SpeechRequest):
        """Kokoro-FastAPI's captioned speech: the whole audio (base64) and its words' times."""
        if not speaker.timestamps:
            raise APIError(400, f"{model_id} ({speaker.family}) gives no word timestamps; Kokoro models do",
                           param="model")
        if req.stream_format is not None:
            raise APIError(400, "captioned speech is one JSON answer; for words while streaming, use "
                                "/v1/audio/speech with stream_format 'sse' (its deltas carry them)", param="stream_format")
        fmt = check_request(req, False)
        body, words = await whole(req, fmt)
        return {"audio": base64.b64encode(body).decode(), "audio_format": fmt.name,
                "sample_rate": speaker.sample_rate, "timestamps": words}

    @app.post("/v1/audio/speech", dependencies=v1)
    async def speech(req: SpeechRequest):
        streaming = req.stream_format is not None
        fmt = check_request(req, streaming)
        if not streaming:
            body, _ = await whole(req, fmt)
            return Response(body, media_type=fmt.media_type)

        slot = await held(time.monotonic() + pool.timeout)
        try:
            await slot.call(speaker.check, slot.model, req)
            pieces = slot.steps(lambda: speaker.pieces(slot.model, req, True))
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
            except (TimedOut, APIError) as e:  # the status is sent: end the stream short, say so in the log
                log.warning("streamed request cut short: %s", e)
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

