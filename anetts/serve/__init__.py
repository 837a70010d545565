"""``anetts serve``: OpenAI's speech API over a built model (:mod:`anetts.serve.app`).

    POST /v1/audio/speech      OpenAI's fields; whole files, `stream_format` audio (bytes as made) or sse
    GET  /v1/audio/voices      the voices (Kokoro: built ones, blends "a(0.7)+b(0.3)"; Fish: registered clips)
    POST /v1/audio/voices      Fish: register a reference clip and its transcript (multipart), get an id
    GET, DELETE /v1/audio/voices/{id}   Fish: the caller's voice (store, owners, caps: anetts.serve.voices)
    GET  /v1/models, /health, / (a page that speaks while it streams)

Settings and limits: :mod:`anetts.serve.config` (no web framework imported); checks before a body is
read: :mod:`anetts.serve.guard`. Needs the ``serve`` extra (FastAPI, uvicorn).
"""
from __future__ import annotations

from anetts.serve.config import ServeConfig

__all__ = ["ServeConfig", "run"]


def run(config: ServeConfig, port: int = 8000, log_level: str = "info") -> None:
    """Load the model instances, then serve on ``config.host`` until interrupted."""
    import uvicorn

    from anetts.serve.app import create_app
    from anetts.serve.http import protocol_with

    app = create_app(config)
    uvicorn.run(app, host=config.host, port=port, log_level=log_level, http=protocol_with(config.header_timeout))
