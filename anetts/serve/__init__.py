"""``anetts serve``: OpenAI's speech API over a built model (:mod:`anetts.serve.app`).

    POST /v1/audio/speech      OpenAI's fields; whole files, `stream_format` audio (bytes as made) or sse
    GET  /v1/audio/voices      the voices (Kokoro: built ones, blends "a(0.7)+b(0.3)"; Fish: registered clips)
    POST /v1/audio/voices      Fish: register a reference clip and its transcript (multipart), get an id
    GET  /v1/models, /health, / (a page that speaks while it streams)

Needs the ``serve`` extra (FastAPI, uvicorn).
"""
from __future__ import annotations

from anetts.serve.app import ServeConfig, create_app

__all__ = ["ServeConfig", "create_app", "run"]


def run(config: ServeConfig, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Load the model instances, then serve until interrupted."""
    import uvicorn

    uvicorn.run(create_app(config), host=host, port=port, log_level=log_level)
