"""A property-based fuzz run over the speech endpoints (kokoro-tiny; the voice upload: tests/fish):
requests drawn from the API's own fields with hostile values (huge numbers, lone surrogates, long
blends, extreme weights, wrong types, bodies that are not JSON, uploads that are not audio or lie in
their headers). Every answer must be a complete response below 500, and the keep-alive connection it
came on must still serve `/health` afterwards (no reset). Derandomized and bounded in count, so a run
is the same run each time."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from serve_helpers import FUZZ, exchange, live_server

KOKORO_VOICES = ["syn_a", "syn_b"]
HOSTILE_TEXT = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="0123456789", min_size=300, max_size=400),  # num2words overflows from 307 digits
    st.sampled_from(["?!", "...", " ", "\u0000", "\ud800", "a\udfffb", "日本語のテキスト。", "x-->y <b>&amp;</b>",
                     "Dr. Smith paid $1,000,000.00 on 3/4/2025.", "\u202e\u200b", "🙂" * 20]),
)
WEIGHT = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   st.sampled_from(["1e308", "-1", "0", "nan", "", "1)(2", "1" * 400]))
VOICE = st.one_of(
    st.sampled_from(KOKORO_VOICES + ["default", "", "af_heart", "xf_x", "../../etc/passwd"]),
    st.lists(st.tuples(st.sampled_from(KOKORO_VOICES + ["zz", "v" * 50]), WEIGHT), min_size=1, max_size=20)
      .map(lambda ts: "+".join(f"{n}({w})" for n, w in ts)),
    st.text(max_size=600),
    st.fixed_dictionaries({"id": st.text(max_size=30)}),
    st.integers(), st.none(), st.lists(st.integers(), max_size=3),
)
ANY_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                        max_leaves=12)
SPEECH = st.fixed_dictionaries(
    {"model": st.one_of(st.just("kokoro-tiny"), st.sampled_from(["tts-1", "gpt-4o-mini-tts"]), st.text(max_size=20)),
     "input": HOSTILE_TEXT, "voice": VOICE},
    optional={"response_format": st.sampled_from(["mp3", "wav", "pcm", "flac", "opus", "aac", "ogg", "", "x" * 300]),
              "speed": st.one_of(st.floats(allow_nan=False, allow_infinity=False, min_value=-10, max_value=10),
                                 st.text(max_size=5), st.integers(-(2**70), 2**70)),
              "stream_format": st.sampled_from(["audio", "sse", "video", None]),
              "seed": st.integers(-(2**70), 2**70),
              "instructions": st.text(max_size=50),
              "extra": ANY_JSON})
# a request that is valid but for at most one hostile field, so that the model, the G2P, the blend
# reader and the encoders are reached, not only the request's validation
PLAIN = {"model": st.just("kokoro-tiny"), "input": st.sampled_from(["Hi.", "One. Two.", "Hello there, 42 times."]),
         "voice": st.sampled_from(KOKORO_VOICES + ["syn_a(0.7)+syn_b(0.3)"]),
         "response_format": st.sampled_from(["pcm", "wav", "mp3", "flac", "opus"]),
         "stream_format": st.sampled_from([None, "audio", "sse"]), "speed": st.sampled_from([0.5, 1.0, 2.0])}
HOSTILE = {"input": HOSTILE_TEXT, "voice": VOICE, "response_format": st.text(max_size=10),
           "stream_format": st.text(max_size=6), "speed": st.floats(-10, 10), "seed": st.integers(-(2**70), 2**70)}


@st.composite
def nearly_valid(draw):
    body = {k: draw(v) for k, v in PLAIN.items()}
    if body["stream_format"] in ("audio",) and body["response_format"] in ("mp3", "flac"):
        body["response_format"] = "pcm"
    field = draw(st.sampled_from([None, None, None, *HOSTILE]))  # a third of them wholly valid
    if field is not None:
        body[field] = draw(HOSTILE[field])
    return {k: v for k, v in body.items() if v is not None}


def _json(b) -> bytes:
    return json.dumps(b).encode()


BODY = st.one_of(nearly_valid().map(_json), nearly_valid().map(_json), SPEECH.map(_json), ANY_JSON.map(_json),
                 st.binary(max_size=200))
PATH = st.sampled_from(["/v1/audio/speech", "/v1/audio/speech", "/v1/audio/speech", "/v1/audio/captioned_speech"])


@pytest.fixture(scope="module")
def kokoro_port(built_workflow):
    from anetts.loader import load

    model_dir = Path(built_workflow) / "artifacts" / "kokoro-tiny"
    tts = load(model_dir, backend="torch", threads=1)
    with live_server([tts], model_dir, max_input_chars=400, timeout=60) as url:
        yield int(url.rsplit(":", 1)[1])


@FUZZ
@given(path=PATH, body=BODY)
def test_speech_endpoints_never_fail_or_reset(kokoro_port, path, body):
    status, _ = exchange(kokoro_port, "POST", path, body, {"Content-Type": "application/json"})
    event(f"status {status}")  # the mix of answers: pytest --hypothesis-show-statistics
