"""`anetts serve` over the session's fish-tiny build with the real `openai` client: speech at 44.1 kHz
whole and streamed (equal to the runtime's), a reference clip registered once and spoken with, and
Fish's own refusals (speed, opus at 44.1 kHz, unknown voices, clips that are not audio) named."""
from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
import soundfile as sf

from serve_helpers import live_server, openai_client, pcm16

MODEL = "fish-tiny"
FRAMES = 6  # per text chunk: fish-tiny's random weights rarely stop on their own


@pytest.fixture(scope="module")
def tts(model_dir):
    import anetts

    return anetts.load(model_dir, backend="torch", threads=1)


@pytest.fixture(scope="module")
def server(tts, model_dir):
    with live_server([tts], model_dir, max_frames=FRAMES) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


@pytest.fixture(scope="module")
def clip(reference_clip):
    return reference_clip


def test_default_voice_whole_and_streamed(client, tts):
    want = tts.synthesize("Hello there.", seed=0, max_frames=FRAMES).audio
    got = client.audio.speech.create(model=MODEL, voice="default", input="Hello there.", response_format="wav")
    audio, rate = sf.read(io.BytesIO(got.content), dtype="int16")
    assert rate == 44100 and audio.size == want.size and np.abs(audio.astype(np.int32) - pcm16(want)).max() <= 1
    with client.audio.speech.with_streaming_response.create(model=MODEL, voice="default", input="Hello there.",
                                                             response_format="pcm", stream_format="audio") as r:
        streamed = np.frombuffer(r.read(), "<i2")
    assert streamed.size == want.size and np.abs(streamed.astype(np.int32) - pcm16(want)).max() <= 1


def test_register_a_reference_clip_and_speak_with_it(client, server, tts, clip):
    data, audio = clip
    voice = client.audio.voices.create(audio_sample=("ref.wav", data, "audio/wav"), name="me", consent="none",
                                       extra_body={"text": "A reference."})
    assert voice.id.startswith("voice_") and voice.name == "me" and voice.object == "audio.voice"
    listed = httpx.get(f"{server}/v1/audio/voices").json()
    assert voice.id in listed["voices"] and listed["cloning"]
    ref = tts.encode_reference(audio, 44100)  # what the server keeps: encoded once, at registration
    want = tts.synthesize("Hi.", tts.make_voice("A reference.", codes=ref), seed=0, max_frames=FRAMES).audio
    got = client.audio.speech.create(model=MODEL, voice={"id": voice.id}, input="Hi.", response_format="pcm")
    assert np.abs(np.frombuffer(got.content, "<i2").astype(np.int32) - pcm16(want)).max() <= 1


@pytest.mark.parametrize("body, param, says", [
    ({"voice": "default", "speed": 1.5}, "speed", "speed"),
    ({"voice": "default", "response_format": "opus"}, "response_format", "44100 Hz"),
    ({"voice": "voice_nobody"}, "voice", "voice_nobody"),
    ({"voice": {"id": "voice_nobody"}}, "voice", "voice_nobody"),
])
def test_fish_refusals_are_named(server, body, param, says):
    r = httpx.post(f"{server}/v1/audio/speech", json={"model": MODEL, "input": "Hi.", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"], err


@pytest.mark.parametrize("files, data, param, says", [
    ({"audio_sample": ("x.wav", b"not audio at all", "audio/wav")}, {"name": "x", "text": "Hi."}, "audio_sample",
     "not audio"),
    ({"audio_sample": ("x.wav", None, "audio/wav")}, {"name": "x", "text": " "}, "text", "empty"),
    ({}, {"name": "x", "text": "Hi."}, "audio_sample", "required"),
])
def test_bad_registrations_are_named(server, clip, files, data, param, says):
    files = {k: (n, clip[0] if b is None else b, t) for k, (n, b, t) in files.items()}
    r = httpx.post(f"{server}/v1/audio/voices", files=files, data=data)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"], err


def test_no_word_timestamps_for_fish(server):
    r = httpx.post(f"{server}/v1/audio/captioned_speech", json={"model": MODEL, "voice": "default", "input": "Hi."})
    assert r.status_code == 400 and "timestamps" in r.json()["error"]["message"], r.text


def test_a_clip_of_the_wrong_rate_is_named(server):
    buf = io.BytesIO()
    sf.write(buf, np.zeros(8000, np.float32), 16000, format="WAV")
    r = httpx.post(f"{server}/v1/audio/voices", files={"audio_sample": ("x.wav", buf.getvalue(), "audio/wav")},
                   data={"name": "x", "text": "Hi."})
    assert r.status_code == 400 and r.json()["error"]["param"] == "audio_sample", r.text


def _flac(seconds: float, rate: int = 44100, channels: int = 1) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.zeros((int(seconds * rate), channels), np.float32), rate, format="FLAC")
    return buf.getvalue()


def _register(server, data: bytes, text: str = "A reference.", name: str = "x") -> httpx.Response:
    return httpx.post(f"{server}/v1/audio/voices", files={"audio_sample": ("clip.flac", data, "audio/flac")},
                      data={"name": name, "text": text}, timeout=120)


def test_a_compressed_upload_is_judged_by_its_header_not_decoded(server, tts):
    """An hour of silence is ~0.5 MB of FLAC and 600 MB decoded: refused from its header, while /health answers."""
    import threading
    import time

    bomb = _flac(3600)
    assert len(bomb) < 2 << 20
    lat, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            t0 = time.perf_counter()
            httpx.get(f"{server}/health", timeout=30)
            lat.append(time.perf_counter() - t0)

    t = threading.Thread(target=poll)
    t.start()
    try:
        r = _register(server, bomb)
    finally:
        stop.set()
        t.join()
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    limit = tts.max_reference_samples / 44100
    assert err["param"] == "audio_sample" and "3600.00 s" in err["message"] and f"{limit:.2f} s" in err["message"]
    assert max(lat) < 1.0, max(lat)


def test_reference_clips_fit_this_models_codec(server, tts):
    """fish-tiny's codec encoder attends over 256 positions of 512 samples: 2.97 s, not the 30 s of S2 Pro."""
    from anetts.models.fish import codec as C

    limit = tts.max_reference_samples
    assert limit == 256 * 512 < C.MAX_REFERENCE_SECONDS * C.SAMPLE_RATE
    rng = np.random.default_rng(0)
    for n, ok in ((limit, True), (limit + 1, False)):
        buf = io.BytesIO()
        sf.write(buf, (0.1 * rng.standard_normal(n)).astype(np.float32), 44100, format="WAV", subtype="FLOAT")
        r = _register(server, buf.getvalue())
        assert (r.status_code == 200) == ok, (n, r.text)
        if not ok:
            assert r.json()["error"]["param"] == "audio_sample" and "2.97 s" in r.json()["error"]["message"]


def test_a_transcript_that_leaves_no_room_is_refused_at_registration(server, clip):
    long = "A reference sentence that goes on. " * 50  # 1,750 characters: under the form limit, over the prompt
    r = _register(server, clip[0], text=long)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "text" and "rows for speech" in err["message"], err
    r = _register(server, clip[0], text="x" * 5000)  # over the form's limit
    assert r.status_code == 400 and r.json()["error"]["param"] == "text", r.text


def test_upload_errors_name_the_file_not_the_process(server):
    r = _register(server, b"\x00" * 4096)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "audio_sample" and "clip.flac" in err["message"]
    assert "0x" not in err["message"] and "BytesIO" not in err["message"], err
    r = _register(server, _flac(0.5, channels=4))
    assert r.status_code == 400 and "4 channels" in r.json()["error"]["message"], r.text
