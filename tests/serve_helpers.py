"""The speech server on loopback for tests: uvicorn in a thread on a free port, over models loaded once."""
from __future__ import annotations

import http.client
import json
import threading
import time
from contextlib import contextmanager

import numpy as np


@contextmanager
def live_server(instances: list, model_dir, **config):
    """Base URL of the app over ``instances`` (``anetts.serve.ServeConfig`` fields in ``config``)."""
    import uvicorn

    from anetts.serve import ServeConfig
    from anetts.serve.app import create_app
    from anetts.serve.http import protocol_with

    cfg = ServeConfig(model_dir, **config)
    app = create_app(cfg, instances=instances)
    server = uvicorn.Server(uvicorn.Config(app, host=cfg.host, port=0, log_level="warning",
                                           http=protocol_with(cfg.header_timeout)))
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


def _fuzz_settings():
    from hypothesis import HealthCheck, settings

    return settings(max_examples=120, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


FUZZ = _fuzz_settings()  # the fuzz runs' bound: a fixed count of derandomized examples


def exchange(port: int, method: str, path: str, body: bytes | None, headers: dict) -> tuple[int, bytes]:
    """One request on a fresh keep-alive connection, then /health on the same connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()  # raises IncompleteRead if the body was cut short
        assert r.status < 500, (r.status, data[:300])
        if r.status >= 400:
            err = json.loads(data)["error"]
            assert set(err) == {"message", "type", "param", "code"} and len(data) < 4096, data[:300]
        if r.getheader("connection", "").lower() != "close":
            conn.request("GET", "/health")
            h = conn.getresponse()
            assert h.status == 200, h.status
            h.read()
        return r.status, data
    finally:
        conn.close()


