"""`anetts serve` (kokoro-tiny) against hostile or careless clients, on loopback: foreign hosts and
origins, keys checked before a body is read, slow request heads, input that reaches third-party
parsers, long blends, streams cut short, work that cannot fit the timeout, clients that give up while
queued. Nothing may answer 5xx, reset a connection after a 4xx, or end a cut stream like a whole one."""
from __future__ import annotations

import asyncio
import http.client
import json
import socket
import time
from pathlib import Path

import httpx
import pytest

from serve_helpers import live_server, openai_client

MODEL = "kokoro-tiny"
THREE = "The sun is out. We walk. Birds sing."


@pytest.fixture(scope="module")
def model_dir(built_workflow) -> Path:
    return Path(built_workflow) / "artifacts" / MODEL


@pytest.fixture(scope="module")
def tts(model_dir):
    from anetts.loader import load

    return load(model_dir, backend="torch", threads=1)


@pytest.fixture(scope="module")
def server(tts, model_dir):
    with live_server([tts], model_dir) as url:
        yield url


def _error(r: httpx.Response, status: int, param: str | None, code: str | None = None) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    assert "Traceback" not in r.text and " at 0x" not in r.text
    return err["message"]


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _speech(**kw) -> dict:
    return {"model": MODEL, "voice": "syn_a", "input": "Hi.", "response_format": "pcm", **kw}


# ------------------------------------------------------------------ hosts, origins, keys


def test_a_foreign_host_is_refused(server):
    """DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends `Host: evil.example`."""
    r = httpx.get(f"{server}/v1/audio/voices", headers={"Host": "evil.example"})
    assert "evil.example" in _error(r, 400, "Host", "host_not_allowed")
    for name in ("localhost", "127.0.0.1", f"127.0.0.1:{_port(server)}", f"localhost:{_port(server)}"):
        assert httpx.get(f"{server}/v1/audio/voices", headers={"Host": name}).status_code == 200, name


def test_allowed_hosts_follow_the_bound_address():
    from anetts.serve.guard import allowed_hosts

    assert allowed_hosts("127.0.0.1") == {"localhost", "127.0.0.1", "::1"}
    assert "tts.lan" in allowed_hosts("127.0.0.1", ["tts.lan"])
    assert "192.168.1.5" in allowed_hosts("192.168.1.5")
    assert allowed_hosts("0.0.0.0") is None  # exposed on every interface under any name: the operator's call
    assert allowed_hosts("0.0.0.0", ["tts.lan"]) == {"localhost", "127.0.0.1", "::1", "tts.lan"}


def test_a_foreign_page_cannot_write(server):
    """A form or fetch POST from another site is a CORS simple request: no preflight protects it."""
    r = httpx.post(f"{server}/v1/audio/speech", json=_speech(), headers={"Origin": "http://evil.example"})
    assert "evil.example" in _error(r, 403, "Origin", "origin_not_allowed")
    r = httpx.post(f"{server}/v1/audio/speech", json=_speech(), headers={"Origin": "null"})
    _error(r, 403, "Origin")
    own = httpx.post(f"{server}/v1/audio/speech", json=_speech(), headers={"Origin": server})
    assert own.status_code == 200 and own.content  # the server's own page
    assert httpx.get(f"{server}/v1/models", headers={"Origin": "http://evil.example"}).status_code == 200


def test_an_allowed_origin_may_write(tts, model_dir):
    with live_server([tts], model_dir, cors_origins=["http://app.example"]) as url:
        r = httpx.post(f"{url}/v1/audio/speech", json=_speech(), headers={"Origin": "http://app.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.example"
        _error(httpx.post(f"{url}/v1/audio/speech", json=_speech(), headers={"Origin": "http://other.example"}),
               403, "Origin")


def test_the_key_is_checked_before_the_body_is_read(tts, model_dir):
    with live_server([tts], model_dir, api_keys=("k-one", "k-two")) as url:
        with socket.create_connection(("127.0.0.1", _port(url)), timeout=10) as s:
            # a head that promises 10 MB and sends none of it: answered at once, not after waiting for the body
            s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 10000000\r\n\r\n")
            r = http.client.HTTPResponse(s)
            r.begin()
            body = r.read().decode()
        assert r.status == 401 and "invalid_api_key" in body, (r.status, body)
        for key in ("k-one", "k-two"):
            ok = httpx.post(f"{url}/v1/audio/speech", json=_speech(), headers={"Authorization": f"Bearer {key}"})
            assert ok.status_code == 200, key
        _error(httpx.post(f"{url}/v1/audio/speech", json=_speech(), headers={"Authorization": "Bearer k-on"}),
               401, None, "invalid_api_key")


def test_keys_come_from_a_file_or_the_environment_never_argv(tmp_path, capsys):
    from anetts.cli import main
    from anetts.serve.guard import read_keys

    f = tmp_path / "keys"
    f.write_text("# team keys\nalpha-key\n\nbeta-key  # for the page\n", encoding="utf-8")
    assert read_keys(f, environ={}) == ("alpha-key", "beta-key")
    assert read_keys(None, environ={"ANETTS_API_KEY": "env-key"}) == ("env-key",)
    assert read_keys(None, environ={}) == ()
    f.write_text("two words\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 1"):
        read_keys(f, environ={})
    assert main(["serve", "--api-key", "s3cret"]) == 2  # the old flag put the key where `ps` shows it
    assert "unrecognized arguments: --api-key" in capsys.readouterr().err  # not taken as --api-key-file
    assert main(["serve", "--api-key-file", str(tmp_path / "missing")]) == 2
    assert "cannot read the API key file" in capsys.readouterr().err


# ------------------------------------------------------------------ the connection itself


def test_a_slow_request_head_is_cut_off(tts, model_dir):
    with live_server([tts], model_dir, header_timeout=0.5) as url:
        with socket.create_connection(("127.0.0.1", _port(url)), timeout=10) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # ... and never the blank line
            t0 = time.monotonic()
            data = b""
            while chunk := s.recv(4096):
                data += chunk
            waited = time.monotonic() - t0
        assert data.startswith(b"HTTP/1.1 408"), data
        assert waited < 5, waited
        with socket.create_connection(("127.0.0.1", _port(url)), timeout=10) as s:  # a silent connection too
            assert s.recv(4096).startswith(b"HTTP/1.1 408")
        assert httpx.get(f"{url}/health").status_code == 200  # a prompt client is served as before


def test_a_number_no_parser_can_read_is_a_4xx_and_the_connection_survives(server):
    """num2words raises OverflowError on a number of 307 digits or more (misaki's English G2P calls it).
    A run of 400 digits is refused as an overlong word first; written in groups of three it reaches
    num2words, whose error becomes a 400 naming the G2P."""
    conn = http.client.HTTPConnection("127.0.0.1", _port(server), timeout=120)
    try:
        for text, says in (("1" * 400, "400 characters"), ("Pay 1" + ",000" * 110 + " dollars.", "G2P cannot read")):
            conn.request("POST", "/v1/audio/speech", body=json.dumps(_speech(input=text)),
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            body = json.loads(r.read())
            assert r.status == 400 and body["error"]["param"] == "input", body
            assert says in body["error"]["message"], body
        conn.request("POST", "/v1/audio/speech", body=json.dumps(_speech()), headers={"Content-Type": "application/json"})
        r = conn.getresponse()  # the same connection: not reset by the bad requests
        assert r.status == 200 and r.read()
    finally:
        conn.close()


def test_an_unexpected_failure_is_a_500_that_keeps_the_connection(tts, model_dir, monkeypatch):
    with live_server([tts], model_dir) as url:
        from anetts.models.kokoro.runtime import KokoroRuntime

        def broken(self, voice):
            raise RuntimeError("disk on fire")

        monkeypatch.setattr(KokoroRuntime, "voice_pack", broken)
        conn = http.client.HTTPConnection("127.0.0.1", _port(url), timeout=60)
        try:
            conn.request("POST", "/v1/audio/speech", body=json.dumps(_speech()), headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            body = json.loads(r.read())
            assert r.status == 500 and body["error"]["type"] == "server_error"
            assert "disk on fire" not in json.dumps(body)
            conn.request("GET", "/health")
            assert conn.getresponse().status == 200
        finally:
            conn.close()


# ------------------------------------------------------------------ bounded input


def test_blends_are_capped_and_their_errors_short(server):
    from anetts.serve.config import MAX_BLEND_TERMS, MAX_VOICE_CHARS

    many = "+".join(f"v{i}" for i in range(MAX_BLEND_TERMS + 1))
    msg = _error(httpx.post(f"{server}/v1/audio/speech", json=_speech(voice=many)), 400, "voice")
    assert f"more than {MAX_BLEND_TERMS}" in msg and len(msg) < 300
    long = "syn_a(1)+" * 60000  # 540 kB of blend
    r = httpx.post(f"{server}/v1/audio/speech", json=_speech(voice=long), timeout=30)
    assert str(MAX_VOICE_CHARS) in _error(r, 400, "voice") and len(r.content) < 1000
    r = httpx.post(f"{server}/v1/audio/speech", json=_speech(voice="syn_a(1e308)+syn_b(1e308)"))
    assert r.status_code == 200 and max(abs(b) for b in r.content) > 0  # an even blend, not silence
    for field, value in (("model", "m" * 10_000), ("response_format", "f" * 10_000), ("instructions", "i" * 10_000)):
        r = httpx.post(f"{server}/v1/audio/speech", json=_speech(**{field: value}))
        _error(r, 400, field)
        assert len(r.content) < 1000, field  # never echoed whole


def test_a_giant_word_is_refused_not_cut(server, tts):
    """espeak-ng reads at most ~160 characters of a word and drops the rest; a word over the frontend's
    limit is refused naming it, and one at the limit is spoken whole."""
    from anetts.models.kokoro.frontend import MAX_WORD_CHARS

    word = "supercalifragilistic" * 200  # 4,000 characters, one word
    msg = _error(httpx.post(f"{server}/v1/audio/speech", json=_speech(input=f"Say {word} now."), timeout=60), 400, "input")
    assert "4000 characters" in msg and f"at most {MAX_WORD_CHARS}" in msg and len(msg) < 400
    fits = "supercalifragilistic" * (MAX_WORD_CHARS // 20)  # 24 phonemes per repeat, every one of them kept
    assert sum(len(c.phonemes) for c in tts.plan(fits, voice="syn_a")) == 24 * (MAX_WORD_CHARS // 20)


def test_a_lone_surrogate_is_named_where_it_is(server):
    body = '{"model": "kokoro-tiny", "voice": "syn_a", "input": "ab\\ud800cd"}'
    r = httpx.post(f"{server}/v1/audio/speech", content=body.encode(), headers={"content-type": "application/json"})
    msg = _error(r, 400, "input")
    assert "surrogate" in msg and "position 2" in msg


def test_the_413_says_so_the_same_way_declared_or_streamed(tts, model_dir):
    with live_server([tts], model_dir, max_body_bytes=2000) as url:
        declared = httpx.post(f"{url}/v1/audio/speech", json=_speech(input="a " * 1500))

        def chunked():
            yield b'{"model": "kokoro-tiny", "voice": "syn_a", "input": "'
            yield b"a " * 1500
            yield b'"}'

        streamed = httpx.post(f"{url}/v1/audio/speech", content=chunked(), headers={"content-type": "application/json"})
        for r in (declared, streamed):
            assert "2000 bytes" in _error(r, 413, "body", "body_too_large")


# ------------------------------------------------------------------ time and truth


def test_work_that_cannot_fit_the_timeout_is_refused_up_front(tts, model_dir):
    with live_server([tts], model_dir, timeout=3.0) as url:
        t0 = time.monotonic()
        r = httpx.post(f"{url}/v1/audio/speech", json=_speech(input=" ".join([THREE] * 100)), timeout=60)
        assert time.monotonic() - t0 < 2.0
        msg = _error(r, 400, "input", "input_too_long_for_timeout")
        assert "timeout of 3 s" in msg
        assert httpx.post(f"{url}/v1/audio/speech", json=_speech(), timeout=60).status_code == 200


def test_a_stream_cut_short_is_not_a_whole_one(tts, model_dir, monkeypatch):
    """A stream that fails after its status went out must not end like a complete body: the server
    aborts the connection, and the client (httpx, like the openai SDK) raises instead of returning."""
    from anetts.runtime.errors import InputError
    from anetts.runtime.planned import Planned

    real = tts.stream

    def failing(*a, **kw):
        it = real(*a, **kw)

        def gen():
            yield next(it)
            raise InputError("a later chunk failed")

        return Planned(gen(), it.units, it.unit)

    with live_server([tts], model_dir) as url:
        monkeypatch.setattr(tts, "stream", failing)  # after the warm-up, which speaks whole
        with pytest.raises(httpx.RemoteProtocolError):
            with httpx.stream("POST", f"{url}/v1/audio/speech", timeout=60,
                              json=_speech(input=THREE, stream_format="audio")) as r:
                assert r.status_code == 200
                for _ in r.iter_bytes():
                    pass
        with httpx.stream("POST", f"{url}/v1/audio/speech", timeout=60,
                          json=_speech(input=THREE, stream_format="sse")) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1]["type"] == "error" and "later chunk" in events[-1]["error"]["message"]


def test_steps_stop_before_the_deadline_not_after():
    """The next step is not begun when the last one's time would carry the request past its deadline."""
    from anetts.serve.pool import ModelPool, TimedOut

    def slow_items():
        for i in range(10):
            time.sleep(0.3)
            yield i

    async def run():
        pool = ModelPool([object()], queue=0, timeout=1.0)
        slot = await pool.acquire(time.monotonic() + 1.0)
        got = []
        t0 = time.monotonic()
        with pytest.raises(TimedOut):
            async for item in slot.steps(slow_items):
                got.append(item)
        slot.release()
        return got, time.monotonic() - t0

    got, took = asyncio.run(run())
    assert got == [0, 1, 2] and took < 1.0, (got, took)


def test_the_last_step_ends_the_request_however_long_it_took():
    """No deadline check follows a request's last piece: nothing is left to begin. (A one-chunk request
    that took more than half its timeout was a 504 after its audio was made.)"""
    from types import SimpleNamespace

    from anetts.serve.pool import ModelPool

    def one_slow_piece():
        time.sleep(0.6)
        yield SimpleNamespace(is_last=True)

    async def run():
        pool = ModelPool([object()], queue=0, timeout=1.0)
        slot = await pool.acquire(time.monotonic() + 1.0)
        got = [item async for item in slot.steps(one_slow_piece)]
        slot.release()
        return got

    assert len(asyncio.run(run())) == 1


def test_a_client_that_gives_up_while_queued_leaves_the_queue(tts, model_dir):
    with live_server([tts], model_dir, queue=2) as url:
        body = _speech(input=" ".join([THREE] * 3), stream_format="audio")
        with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=60) as first:
            next(first.iter_bytes())  # the only worker is busy with this stream
            with socket.create_connection(("127.0.0.1", _port(url)), timeout=10) as s:
                payload = json.dumps(_speech()).encode()
                s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
                t0 = time.monotonic()
                while httpx.get(f"{url}/health").json()["queued"] != 1:
                    assert time.monotonic() - t0 < 10
                    time.sleep(0.02)
            # that client hung up while waiting: it leaves the queue while the worker is still busy
            t0 = time.monotonic()
            while (h := httpx.get(f"{url}/health").json())["queued"]:
                assert time.monotonic() - t0 < 5, h
                time.sleep(0.02)
            assert h["busy"] == 1


# ------------------------------------------------------------------ warm and light


def test_warmup_loads_the_g2p_and_only_the_buckets_it_speaks_with(model_dir):
    from anetts.loader import load
    from anetts.models.kokoro import frontend as F

    tts = load(model_dir, backend="torch", threads=1)
    F._g2p.cache_clear()
    tts.warmup()
    assert F._g2p.cache_info().currsize == 1 and tts.backend.loaded() == []  # the English G2P, no package
    with live_server([tts], model_dir) as url:  # the server's warm-up speaks: the buckets that takes
        assert set(tts.backend.loaded()) == {("duration", "t32"), ("f0ntrain", "3s"), ("decoder_pre", "3s"),
                                             ("generator", "3s")}
        assert openai_client(url).audio.speech.create(model=MODEL, voice="syn_a", input="Hi.").content


def test_an_upload_that_kills_its_decoder_does_not_kill_the_server():
    """Uploads are decoded in a child process: one that crashes there is a ClipError, and the next
    upload gets a new child."""
    import io
    import os
    import signal

    import numpy as np
    import soundfile as sf

    from anetts.serve.upload import ClipError, ClipLimit, ClipReader, read_clip

    buf = io.BytesIO()
    sf.write(buf, np.zeros(4410, np.float32), 44100, format="WAV")
    limit = ClipLimit(44100, 44100)

    async def run():
        reader = ClipReader()
        try:
            first = await reader.call(os.getpid)
            assert first != os.getpid()  # another process
            with pytest.raises(ClipError, match="'crash.wav' could not be decoded"):
                await reader.call(os.kill, first, signal.SIGSEGV, what="audio_sample 'crash.wav'")
            clip, rate = await reader.call(read_clip, buf.getvalue(), "ok.wav", limit)
            assert rate == 44100 and clip.shape == (4410,)
            assert await reader.call(os.getpid) != first  # a fresh child
        finally:
            reader.close()

    asyncio.run(run())
