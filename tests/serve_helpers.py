"""The speech server on loopback for tests: uvicorn in a thread on a free port, over models loaded once."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import numpy as np


@contextmanager
def live_server(instances: list, model_dir, **config):
    """Base URL of the app over ``instances`` (``anetts.serve.ServeConfig`` fields in ``config``)."""
    import uvicorn

    from anetts.serve import ServeConfig, create_app

    app = create_app(ServeConfig(model_dir, **config), instances=instances)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    t0 = time.monotonic()
    while not server.started:
        if not thread.is_alive() or time.monotonic() - t0 > 30:
            raise AssertionError("the test server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def pcm16(audio: np.ndarray) -> np.ndarray:
    """What a 16-bit response holds for float audio: clipped, x 32767, rounded half to even (libsndfile's lrintf)."""
    return np.round(np.clip(np.asarray(audio, np.float64), -1, 1) * 32767).astype(np.int16)


def openai_client(base_url: str, api_key: str = "unused", **kw):
    from openai import OpenAI

    return OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=120, **kw)
