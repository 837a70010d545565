"""Text input, chunking of long input, joins, streaming and reproducibility."""
from __future__ import annotations

import logging

import numpy as np

from anetts.models.kokoro.runtime import KokoroRuntime
from anetts.runtime.audio import join_continuity
from rt_common import MEDIUM, SHORT

LONG = f"{SHORT} {MEDIUM} {SHORT} ɪt ɪz ɡˈʊd, ænd ɪt wˈɜːks."


def test_text_through_offline_g2p(tts):
    r = tts.synthesize("Hi there.", voice="syn_b")
    assert len(r.chunks) == 1 and r.chunks[0].text == "Hi there."
    assert r.chunks[0].phonemes and r.audio.shape[0] == r.durations.sum() * 600
    assert r.timings["frontend"] > 0 and np.isfinite(r.audio).all()


def test_unknown_symbols_are_dropped_with_a_warning(tts, caplog):
    with caplog.at_level(logging.WARNING):
        r = tts.synthesize(phonemes=SHORT + " ∆", voice="syn_a")
    assert "∆" in caplog.text
    clean = tts.synthesize(phonemes=SHORT, voice="syn_a")
    assert r.chunks[0].input_ids == clean.chunks[0].input_ids


def test_long_input_is_chunked_within_buckets_and_joined_without_clicks(tts):
    limit = 16
    r = tts.synthesize(phonemes=LONG, voice="syn_a", max_phonemes=limit)
    assert len(r.chunks) >= 3
    A = tts.artifacts
    for c in r.chunks:
        assert 0 < len(c.phonemes) <= limit
        assert len(c.input_ids) <= A.package("duration", c.buckets["duration"]).tokens
        for stage in ("f0ntrain", "decoder_pre", "generator"):
            assert c.frames <= A.package(stage, c.buckets[stage]).frames
    # chunks at sentence/clause marks, in order, nothing lost
    assert " ".join(c.phonemes for c in r.chunks) == LONG
    assert r.audio.shape[0] == sum(c.frames for c in r.chunks) * 600
    boundaries = np.cumsum([c.audio.shape[0] for c in r.chunks])[:-1].tolist()
    for j in join_continuity(r.audio, boundaries):
        assert j["jump"] <= j["max_local_delta"], j


def test_stream_yields_chunk_by_chunk_and_matches_synthesize(tts):
    stream = tts.stream(phonemes=LONG, voice="syn_a", max_phonemes=16, seed=5)
    first = next(stream)  # available before the rest is synthesized
    assert first.index == 0 and first.total >= 3 and not first.is_last
    rest = list(stream)
    assert rest[-1].is_last and [c.index for c in rest] == list(range(1, len(rest) + 1))
    joined = np.concatenate([first.audio] + [c.audio for c in rest])
    np.testing.assert_array_equal(joined, tts.synthesize(phonemes=LONG, voice="syn_a", max_phonemes=16, seed=5).audio)


def test_chunk_predicted_longer_than_the_largest_bucket_is_split(tts):
    """At low speed a chunk that fits by the estimate overflows 3 s; it is split, not failed."""
    runtime = KokoroRuntime(tts.artifacts, tts.backend, tokens_per_second=40.0)  # a far too optimistic estimate
    r = runtime.synthesize(phonemes=f"{MEDIUM} {MEDIUM}", voice="syn_a", speed=0.5)
    assert len(r.chunks) >= 2
    assert all(c.frames <= 120 for c in r.chunks)
    assert r.audio.shape[0] == sum(c.frames for c in r.chunks) * 600


def test_seeded_noise_is_reproducible(tts):
    a = tts.synthesize(phonemes=SHORT, voice="syn_a", seed=7).audio
    b = tts.synthesize(phonemes=SHORT, voice="syn_a", seed=7).audio
    c = tts.synthesize(phonemes=SHORT, voice="syn_a", seed=8).audio
    np.testing.assert_array_equal(a, b)
    assert a.shape == c.shape and not np.array_equal(a, c)


def test_speed_scales_length(tts):
    slow = tts.synthesize(phonemes=SHORT, voice="syn_a", speed=0.8)
    fast = tts.synthesize(phonemes=SHORT, voice="syn_a", speed=1.6)
    assert slow.audio.shape[0] > fast.audio.shape[0]


def test_voice_choice(tts):
    """The voice picks the style: another voice speaks differently, none is the default voice (the
    first the build lists: the tiny build has no af_heart)."""
    a, b, default = (tts.synthesize(phonemes=SHORT, voice=v, seed=0).audio for v in ("syn_a", "syn_b", None))
    assert tts.default_voice == tts.artifacts.manifest["weights"]["voices"][0] == "syn_a"
    assert np.array_equal(default, a)
    assert a.shape != b.shape or not np.allclose(a, b, atol=1e-3)
