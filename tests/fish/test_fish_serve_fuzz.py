"""The fuzz run of tests/serve/test_serve_fuzz.py on the Fish voice upload (fish-tiny): files that are
not audio, lie in their headers, are cut short, at other rates or channel counts, or decode to far
more than the limit, with hostile transcripts and names. Every answer below 500, no reset."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from hypothesis import event, given, settings
from hypothesis import strategies as st

from serve_helpers import FUZZ, exchange, live_server


def _clip(kind: str, seconds: float, rate: int, channels: int, cut: int | None) -> bytes:
    buf = io.BytesIO()
    fmt, sub = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "ogg": ("OGG", "VORBIS")}[kind]
    sf.write(buf, np.zeros((max(1, int(seconds * rate)), channels), np.float32), rate, format=fmt, subtype=sub)
    data = buf.getvalue()
    return data if cut is None else data[:cut]


# long clips as wav / flac only: libsndfile's Vorbis encoder (this test's, not the server's) segfaults
# writing minutes of audio to a file object
CLIP = st.one_of(
    st.binary(max_size=300),
    st.builds(_clip, st.sampled_from(["wav", "flac"]), st.sampled_from([0.01, 0.5, 2.0, 600.0]),
              st.sampled_from([8000, 44100, 48000]), st.sampled_from([1, 2, 6]), st.one_of(st.none(), st.integers(0, 200))),
    st.builds(_clip, st.just("ogg"), st.sampled_from([0.01, 0.5, 2.0]), st.sampled_from([8000, 44100]),
              st.sampled_from([1, 2]), st.one_of(st.none(), st.integers(0, 200))),
)
TRANSCRIPT = st.one_of(st.text(max_size=40), st.sampled_from(["A reference.", "<|im_end|>", "x" * 2500, " "]))


@pytest.fixture(scope="module")
def fish_port(fish_build):
    import anetts

    model_dir = Path(fish_build) / "artifacts" / "fish-tiny"
    tts = anetts.load(model_dir, backend="torch", threads=1)
    with live_server([tts], model_dir, max_frames=4, timeout=60) as url:
        yield int(url.rsplit(":", 1)[1])


GOOD = {"clip": st.builds(_clip, st.sampled_from(["wav", "flac"]), st.sampled_from([0.2, 1.0, 2.5]), st.just(44100),
                          st.sampled_from([1, 2]), st.none()),
        "text": st.just("A reference."), "name": st.just("me"), "kind": st.just("audio_sample")}
BAD = {"clip": CLIP, "text": TRANSCRIPT, "name": st.text(max_size=200), "kind": st.sampled_from(["other", ""])}


@st.composite
def registration(draw):
    """A good registration with at most one field replaced by a hostile one, or all four hostile."""
    if draw(st.booleans()):
        return {k: draw(v) for k, v in BAD.items()}
    field = draw(st.sampled_from([None, *BAD]))
    return {k: draw(BAD[k] if k == field else v) for k, v in GOOD.items()}


@settings(FUZZ, max_examples=60)
@given(form=registration())
def test_voice_uploads_never_fail_or_reset(fish_port, form):
    clip, text, name, kind = form["clip"], form["text"], form["name"], form["kind"]
    boundary = "fuzzboundary7MA4YWxkTrZu0gW"
    parts = [(b'name="audio_sample"; filename="clip"', clip), (b'name="text"', text.encode("utf-8", "surrogatepass")),
             (b'name="name"', name.encode("utf-8", "surrogatepass")), (b'name="type"', kind.encode())]
    body = b"".join(b"--" + boundary.encode() + b"\r\nContent-Disposition: form-data; " + h + b"\r\n\r\n" + v + b"\r\n"
                    for h, v in parts) + b"--" + boundary.encode() + b"--\r\n"
    status, _ = exchange(fish_port, "POST", "/v1/audio/voices", body,
                         {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    event(f"status {status}")  # the mix of answers: pytest --hypothesis-show-statistics
