"""`anetts serve` over the session's kokoro-tiny build, driven by the real `openai` client on loopback:
whole responses equal the CLI's audio, streams arrive sentence by sentence and equal the runtime's
sentence-chunked audio, voice blends, every format, and every client fault a 4xx in OpenAI's shape."""
from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from anetts.runtime.captions import spoken
from serve_helpers import live_server, openai_client, pcm16

MODEL = "kokoro-tiny"
THREE = "The sun is out. We walk. Birds sing."  # three sentences, one chunk each in the t32 / 3 s build


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


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def _error(r: httpx.Response, status: int, param: str | None) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["param"] == param, body
    assert "Traceback" not in r.text
    return body["error"]["message"]


def test_whole_response_equals_the_cli(client, model_dir, tmp_path):
    from anetts.cli import main

    out = tmp_path / "cli.wav"
    assert main(["speak", THREE, "-o", str(out), "--model-dir", str(model_dir), "--backend", "torch",
                 "--voice", "syn_a", "--threads", "1", "--no-progress"]) == 0
    cli, rate = sf.read(str(out), dtype="float32")
    got = client.audio.speech.create(model=MODEL, voice="syn_a", input=THREE, response_format="wav")
    audio, got_rate = sf.read(io.BytesIO(got.content), dtype="int16")
    assert got_rate == rate == 24000 and audio.shape == cli.shape
    assert np.abs(audio.astype(np.int32) - pcm16(cli)).max() <= 1  # the 16-bit rounding of the CLI's float wav


@pytest.fixture(scope="module")
def hello(tts):
    return tts.synthesize("Hello there.", voice="syn_b").audio


@pytest.mark.parametrize("fmt", ["mp3", "flac", "opus", "pcm", "wav"])
def test_every_format_decodes(client, hello, fmt):
    want = hello
    got = client.audio.speech.create(model="tts-1", voice="syn_b", input="Hello there.", response_format=fmt).content
    if fmt == "pcm":
        audio = np.frombuffer(got, "<i2").astype(np.float32) / 32767
    else:
        audio, rate = sf.read(io.BytesIO(got), dtype="float32")
        assert rate == 24000
    if fmt in ("mp3", "opus"):  # lossy, and the encoders add padding
        assert abs(audio.size - want.size) <= 0.1 * want.size + 2048
    else:
        assert audio.size == want.size and np.abs(audio - want).max() < 1e-4


def test_stream_arrives_sentence_by_sentence(client, tts):
    plan = tts.plan(THREE, sentences=True)
    assert len(plan) >= 3, plan
    want = np.concatenate([c.audio for c in tts.stream(THREE, voice="syn_a", sentences=True)])
    parts = []
    with client.audio.speech.with_streaming_response.create(model=MODEL, voice="syn_a", input=THREE,
                                                             response_format="pcm", stream_format="audio") as r:
        assert r.headers["content-type"] == "audio/pcm"
        parts = [p for p in r.iter_bytes() if p]
    audio = np.frombuffer(b"".join(parts), "<i2")
    assert len(parts) >= len(plan)  # at least one body chunk per sentence chunk
    assert audio.size == want.size and np.abs(audio.astype(np.int32) - pcm16(want)).max() <= 1


@pytest.mark.parametrize("fmt", ["wav", "opus"])
def test_streamed_containers_decode(client, tts, fmt):
    with client.audio.speech.with_streaming_response.create(model=MODEL, voice="syn_a", input=THREE,
                                                             response_format=fmt, stream_format="audio") as r:
        data = r.read()
    audio, rate = sf.read(io.BytesIO(data), dtype="float32")
    n = sum(c.audio.size for c in tts.stream(THREE, voice="syn_a", sentences=True))
    assert rate == 24000 and (audio.size == n if fmt == "wav" else abs(audio.size - n) < 0.1 * n)
    if fmt == "wav":
        assert data[4:8] == b"\xff\xff\xff\xff"  # the RIFF size: unknown while streaming


def test_sse_events(server, tts):
    with httpx.stream("POST", f"{server}/v1/audio/speech", timeout=60,
                      json={"model": MODEL, "voice": "syn_a", "input": THREE, "response_format": "pcm",
                            "stream_format": "sse"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done"
    audio = np.frombuffer(b"".join(base64.b64decode(e["audio"]) for e in events[:-1]), "<i2")
    chunks = list(tts.stream(THREE, voice="syn_a", sentences=True))
    assert audio.size == sum(c.audio.size for c in chunks)
    words = [w for e in events[:-1] for w in e.get("words", [])]  # each delta carries its chunk's words
    assert words and words == [{"word": w.word, "start_time": w.start_time, "end_time": w.end_time}
                               for c in chunks for w in spoken(c.words)]  # punctuation left out
    usage = events[-1]["usage"]
    assert usage["input_tokens"] == sum(len(c.input_ids) for c in chunks)
    assert usage["output_tokens"] == sum(c.frames for c in chunks)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_captioned_speech_gives_the_runtimes_word_times(server, tts):
    from dataclasses import asdict

    want = tts.synthesize(THREE, voice="syn_a")
    r = httpx.post(f"{server}/v1/audio/captioned_speech", timeout=120,
                   json={"model": MODEL, "voice": "syn_a", "input": THREE, "response_format": "wav"})
    assert r.status_code == 200, r.text
    got = r.json()
    audio, rate = sf.read(io.BytesIO(base64.b64decode(got["audio"])), dtype="int16")
    assert rate == 24000 and audio.size == want.audio.size and got["audio_format"] == "wav"
    assert want.words and got["timestamps"] == [asdict(w) for w in spoken(want.words)]
    assert [w["word"] for w in got["timestamps"] if w["word"].isalpha()][:3] == ["The", "sun", "is"]
    r = httpx.post(f"{server}/v1/audio/captioned_speech", timeout=60,
                   json={"model": MODEL, "voice": "syn_a", "input": "Hi.", "stream_format": "sse"})
    assert "sse" in _error(r, 400, "stream_format")


def test_voice_blend(client, tts, server):
    blend = "syn_a(0.7)+syn_b(0.3)"
    want = tts.synthesize("Hello there.", voice=blend).audio
    pack = tts.voice_pack(blend)
    np.testing.assert_allclose(pack, 0.7 * tts.voice_pack("syn_a") + 0.3 * tts.voice_pack("syn_b"), rtol=1e-6)
    np.testing.assert_array_equal(pack, tts.voice_pack("syn_a(7)+syn_b(3)"))  # weights normalized
    got = client.audio.speech.create(model=MODEL, voice=blend, input="Hello there.", response_format="pcm").content
    assert np.abs(np.frombuffer(got, "<i2").astype(np.int32) - pcm16(want)).max() <= 1
    for voice, named in (("syn_a(0.7)+nope(0.3)", "nope"), ("syn_a(-1)+syn_b", "syn_a"), ("syn_a(x)", "syn_a"),
                         ("syn_a+syn_a", "syn_a"), ("nobody", "nobody")):
        r = httpx.post(f"{server}/v1/audio/speech", json={"model": MODEL, "voice": voice, "input": "Hi."}, timeout=60)
        assert named in _error(r, 400, "voice")


def test_cli_speaks_a_blend(model_dir, tmp_path):
    from anetts.cli import main

    out = tmp_path / "blend.wav"
    assert main(["speak", "Hello.", "-o", str(out), "--model-dir", str(model_dir), "--backend", "torch",
                 "--voice", "syn_a(1)+syn_b(1)", "--threads", "1", "--no-progress"]) == 0
    assert sf.info(str(out)).frames > 0
    assert main(["speak", "Hello.", "-o", str(out), "--model-dir", str(model_dir), "--backend", "torch",
                 "--voice", "syn_a(0)+syn_b(1)", "--no-progress"]) == 1


@pytest.mark.parametrize("body, status, param, says", [
    ({"voice": "syn_a", "input": "Hi."}, 400, "model", "required"),
    ({"model": MODEL, "voice": "syn_a"}, 400, "input", "required"),
    ({"model": MODEL, "voice": "syn_a", "input": "   "}, 400, "input", "empty"),
    ({"model": MODEL, "voice": "syn_a", "input": "x" * 4097}, 400, "input", "4097 characters"),
    ({"model": MODEL, "voice": "syn_a", "input": "?!"}, 400, "input", "nothing to speak"),
    ({"model": MODEL, "voice": "syn_a", "input": "Hi.", "speed": 5}, 400, "speed", "4"),
    ({"model": MODEL, "voice": "syn_a", "input": "Hi.", "speed": "fast"}, 400, "speed", "number"),
    ({"model": MODEL, "voice": "syn_a", "input": "Hi.", "response_format": "aac"}, 400, "response_format", "AAC"),
    ({"model": MODEL, "voice": "syn_a", "input": "Hi.", "response_format": "ogg"}, 400, "response_format", "unknown"),
    ({"model": MODEL, "voice": "syn_a", "input": "Hi.", "response_format": "mp3", "stream_format": "audio"},
     400, "response_format", "cannot be streamed"),
    ({"model": MODEL, "voice": "syn_a", "input": "Hi.", "stream_format": "video"}, 400, "stream_format", "audio"),
    ({"model": MODEL, "voice": {"name": "syn_a"}, "input": "Hi."}, 400, "voice", ""),
    ({"model": MODEL, "voice": 3, "input": "Hi."}, 400, "voice", ""),
    ({"model": MODEL, "voice": "syn_a", "input": "Hi.", "volume": 2}, 400, "volume", "not a field"),
    ({"model": "gpt-5", "voice": "syn_a", "input": "Hi."}, 404, "model", "gpt-5"),
    ([1, 2], 400, None, "object"),
])
def test_bad_requests_are_named(server, body, status, param, says):
    r = httpx.post(f"{server}/v1/audio/speech", json=body, timeout=60)
    assert says in _error(r, status, param)


def test_malformed_bodies_and_paths(server):
    r = httpx.post(f"{server}/v1/audio/speech", content=b'{"model": ', headers={"content-type": "application/json"})
    assert "JSON" in _error(r, 400, None)
    _error(httpx.get(f"{server}/v1/nothing"), 404, None)
    _error(httpx.get(f"{server}/v1/audio/speech"), 405, None)
    r = httpx.post(f"{server}/v1/audio/voices", files={"audio_sample": ("a.wav", b"RIFF")},
                   data={"name": "me", "text": "Hi."})
    assert "does not clone voices" in _error(r, 400, "audio_sample")


@pytest.mark.parametrize("body, param", [
    ({"references": [{"audio": "UklGRg==", "text": "Hi."}]}, "references"),
    ({"ref_audio": "UklGRg==", "ref_text": "Hi."}, "ref_audio"),
])
def test_inline_references_are_refused_by_a_model_that_does_not_clone(server, body, param):
    r = httpx.post(f"{server}/v1/audio/speech", json={"model": MODEL, "input": "Hi.", **body})
    assert "does not clone voices" in _error(r, 400, param)


def test_openai_client_sees_the_error(client):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        client.audio.speech.create(model=MODEL, voice="syn_a(1)+ghost(1)", input="Hi.")
    assert e.value.body["param"] == "voice" and "ghost" in e.value.body["message"]


def test_listing_endpoints(client, server):
    assert [m.id for m in client.models.list()] == [MODEL]
    voices = httpx.get(f"{server}/v1/audio/voices").json()
    assert voices["voices"] == ["syn_a", "syn_b"] and voices["blending"] and voices["timestamps"]
    assert not voices["cloning"]
    health = httpx.get(f"{server}/health").json()
    assert health["status"] == "ok" and health["sample_rate"] == 24000 and health["busy"] == 0


def test_api_key_body_limit_and_cors(tts, model_dir):
    import openai

    with live_server([tts], model_dir, api_keys=("s3cret",), max_body_bytes=2000,
                     cors_origins=["http://app.example"]) as url:
        with pytest.raises(openai.AuthenticationError):
            openai_client(url, api_key="wrong").audio.speech.create(model=MODEL, voice="syn_a", input="Hi.")
        _error(httpx.get(f"{url}/v1/models"), 401, None)
        assert httpx.get(f"{url}/health").status_code == 200
        ok = openai_client(url, api_key="s3cret").audio.speech.create(model=MODEL, voice="syn_a", input="Hi.",
                                                                       response_format="pcm")
        assert len(ok.content) > 0
        r = httpx.post(f"{url}/v1/audio/speech", json={"model": MODEL, "voice": "syn_a", "input": "a " * 1500},
                       headers={"Authorization": "Bearer s3cret"})
        assert "2000 bytes" in _error(r, 413, "body")

        def chunked():  # no content-length: counted as it comes
            yield b'{"model": "kokoro-tiny", "voice": "syn_a", "input": "'
            yield b"a " * 1500
            yield b'"}'

        r = httpx.post(f"{url}/v1/audio/speech", content=chunked(),
                       headers={"Authorization": "Bearer s3cret", "content-type": "application/json"})
        assert "2000 bytes" in _error(r, 413, "body")
        pre = httpx.options(f"{url}/v1/audio/speech", headers={"Origin": "http://app.example",
                                                               "Access-Control-Request-Method": "POST"})
        assert pre.headers.get("access-control-allow-origin") == "http://app.example"
    with live_server([tts], model_dir) as url:  # CORS off unless configured
        r = httpx.get(f"{url}/v1/models", headers={"Origin": "http://app.example"})
        assert "access-control-allow-origin" not in r.headers


def test_full_queue_is_429_and_a_client_that_leaves_frees_its_slot(tts, model_dir):
    with live_server([tts], model_dir, queue=0) as url:
        body = {"model": MODEL, "voice": "syn_a", "input": " ".join([THREE] * 2), "response_format": "pcm",
                "stream_format": "audio"}
        with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=60) as first:
            assert first.status_code == 200
            next(first.iter_bytes())  # the worker is busy with this stream now
            r = httpx.post(f"{url}/v1/audio/speech", json={**body, "stream_format": None}, timeout=60)
            _error(r, 429, None)
            assert int(r.headers["retry-after"]) >= 1
        # the client left mid-stream: its slot comes back once the chunk in progress is done
        t0 = time.monotonic()
        while httpx.get(f"{url}/health").json()["busy"] and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        assert httpx.get(f"{url}/health").json()["busy"] == 0
        r = httpx.post(f"{url}/v1/audio/speech", json={**body, "input": "Hi."}, timeout=60)
        assert r.status_code == 200 and len(r.content) > 0


def test_anetts_serve_command(model_dir):
    """The command itself: a subprocess serving on a free port until stopped; bad options exit 2."""
    import socket

    from anetts.cli import main

    assert main(["serve", "--model-dir", str(model_dir), "--workers", "0"]) == 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "anetts.cli", "serve", "--model-dir", str(model_dir),
                             "--backend", "torch", "--threads", "1", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        t0 = time.monotonic()
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() - t0 < 120, proc.stdout.read() if proc.poll() else "slow"
            time.sleep(0.2)
        got = openai_client(f"http://127.0.0.1:{port}").audio.speech.create(model=MODEL, voice="syn_b", input="Hi.")
        assert sf.info(io.BytesIO(got.content)).format == "MP3"  # OpenAI's default format
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_server_option_the_model_does_not_take_is_refused_at_start(tts):
    """`anetts serve --max-frames` (a Fish option) over a Kokoro build: refused by name, not dropped."""
    from anetts.runtime import TTSError
    from anetts.serve.speech import Speaker

    with pytest.raises(TTSError, match="--max-frames: not an option of kokoro-tiny"):
        Speaker("kokoro-tiny", tts, options={"max_frames": 6})
    assert Speaker("kokoro-tiny", tts, options={"max_frames": None}).voices() == tts.voices


def test_a_prefix_cache_cap_is_refused_for_a_build_that_keeps_none(tts, model_dir):
    from anetts.runtime.errors import TTSError
    from anetts.serve import ServeConfig
    from anetts.serve.app import create_app

    with pytest.raises(TTSError, match=r"--prefix-cache-mb: not an option of kokoro-tiny \(kokoro\)"):
        create_app(ServeConfig(model_dir, prefix_cache_mb=64), instances=[tts])
    create_app(ServeConfig(model_dir), instances=[tts, tts])  # without the flag, nothing to share or refuse
