"""The runtime over upstream's frontend: word timestamps, audio against upstream `KPipeline`, threads."""
from __future__ import annotations

import dataclasses
import functools
import json

import numpy as np
import pytest
import torch

from anetts.models.kokoro.dsp import SourceDraws
from anetts.models.kokoro.frontend import frontend
from anetts.models.kokoro.end_to_end import compare_texts, replayed_draws, waveform_snr_db
from anetts.runtime.captions import WordTimestamp
from anetts.runtime import InputError
from concurrency import at_once
from rt_common import SHORT
from upstream_frontend import pipeline

# One chunk each on the tiny build (t32: at most 30 phonemes).
ONE_CHUNK = {
    "a": ["Dr. Li paid $3.", "I read it; wind the clock!"],
    "b": ["Schedule it, mate."],
    "j": ["今日は3日です。"],
    "z": ["你好，3.5元。"],
    "e": ["Hola, tengo 3 gatos."],
}


def _times(tokens) -> list[WordTimestamp]:
    return [WordTimestamp(t.text, t.start_ts, t.end_ts) for t in tokens if t.start_ts is not None]


@pytest.mark.parametrize("code, text", [(c, t) for c, texts in ONE_CHUNK.items() for t in texts])
def test_text_audio_and_word_times_equal_upstream_pipeline(tts, kmodel, code, text):
    """Phonemes, durations and word times equal upstream KPipeline's on the same weights, and the
    audio passes the end-to-end check's gate (upstream's source draws replayed)."""
    r = tts.synthesize(text, voice="syn_a", lang=code, seed=3)
    (chunk,) = r.chunks
    pack = torch.from_numpy(tts.voice_pack("syn_a")[:, None, :].copy())
    draws = SourceDraws.sample(chunk.frames * 600, np.random.default_rng(3))
    with replayed_draws(draws):
        (up,) = [u for u in pipeline(code, kmodel)(text, voice=pack) if u.phonemes]
    assert (chunk.text, chunk.phonemes) == (up.graphemes, up.phonemes)
    np.testing.assert_array_equal(chunk.pred_dur, up.pred_dur.numpy())
    assert r.words == (_times(up.tokens) if code in "ab" else [])
    (row,) = compare_texts(tts, kmodel, [chunk.phonemes], seed=3, voice="syn_a")
    assert row["durations_equal"] and row["seed_floor"]["log_mel_corr"] - row["log_mel_corr"] <= 0.0005, row
    # KPipeline's audio is the end-to-end check's upstream audio: the same SNR to the runtime's
    assert waveform_snr_db(up.audio.numpy(), r.audio) == pytest.approx(row["waveform_snr_db"], abs=1e-6)


PASSAGE = ("The quick brown fox jumps over the lazy dog, which was not amused at all. Everyone had been waiting "
           "for hours; some read books, others played cards, and a few slept. Nobody expected it to last so long.")


def test_word_times_span_the_whole_output_across_chunks(tts):
    r = tts.synthesize(PASSAGE, voice="syn_a", seed=1)
    assert len(r.chunks) >= 4 and r.words == [w for c in r.chunks for w in c.words]
    samples = 0
    for c in r.chunks:  # each chunk's words lie within its own stretch of the output
        start, end = samples / 24000, (samples + c.audio.shape[0]) / 24000
        assert c.words and all(start <= w.start_time <= w.end_time <= end for w in c.words), c.text
        samples += c.audio.shape[0]
    times = [t for w in r.words for t in (w.start_time, w.end_time)]
    assert times == sorted(times) and times[-1] <= r.seconds
    # every token misaki times, in order, none lost at chunk boundaries
    assert [w.word for w in r.words] == [w.text for w in frontend("a").words(PASSAGE) if w.phonemes]


def test_a_word_longer_than_a_chunk_is_cut_and_has_no_time(tts):
    """Tiny buckets (30 phonemes): "$12.50" alone is 32; upstream would truncate it, here it is cut."""
    r = tts.synthesize("He paid $12.50 today.", voice="syn_a")
    assert "12.50" not in [w.word for w in r.words] and "today" in [w.word for w in r.words]
    assert "".join(c.phonemes for c in r.chunks).replace(" ", "") == \
        frontend("a").chunks("He paid $12.50 today.")[0].phonemes.replace(" ", "")


def test_phonemes_give_no_words(tts):
    r = tts.synthesize(phonemes=SHORT, voice="syn_a")
    assert r.words == [] and r.chunks[0].words == []


def test_lang_is_validated_against_upstreams_table(tts):
    with pytest.raises(InputError, match=r"unknown language 'xx-yy'.*j \(Japanese\)"):
        tts.synthesize("Hello.", voice="syn_a", lang="xx-yy")


def test_concurrent_synthesis_equals_sequential(tts):
    """Eight threads on one loaded model, every G2P, bit-equal to one thread (issue 21 item 2)."""
    # each G2P in two threads at once; made-up words send English through its espeak fallback
    jobs = [("Zyxtrol met Kwibbit.", "a"), ("Blorfen saw Quazzle.", "a"), ("Snorgle, Dr. Vextrum.", "b"),
            ("Plimbo and Grusk.", "b"), ("Hola, tengo 3 gatos.", "e"), ("Buenos días, Ana.", "e"),
            ("今日は良い天気。", "j"), ("你好，天气很好。", "z")]
    expected = [tts.synthesize(t, voice="syn_a", lang=code, seed=k).audio for k, (t, code) in enumerate(jobs)]
    for _ in range(3):
        got = at_once([functools.partial(tts.synthesize, t, voice="syn_a", lang=c, seed=k) for k, (t, c) in enumerate(jobs)])
        for k, (a, b) in enumerate(zip(expected, got)):
            assert a.shape == b.audio.shape and np.array_equal(a, b.audio), jobs[k]


def test_cli_writes_word_timestamps(tts, model_dir, tmp_path):
    from anetts.cli import main

    text = "Dr. Smith paid $3."
    expected = tts.synthesize(text, voice="syn_a").words
    assert [w.word for w in expected] == ["Dr.", "Smith", "paid", "3", "."]  # "$" has no phonemes: "3" says "three dollars"
    out = tmp_path / "o.wav"
    for suffix in (".json", ".srt", ".vtt"):
        stamps = tmp_path / f"words{suffix}"
        assert main(["speak", text, "--voice", "syn_a", "--model-dir", str(model_dir), "-o", str(out),
                     "--timestamps", str(stamps)]) == 0
        body = stamps.read_text(encoding="utf-8")
        if suffix == ".json":
            assert json.loads(body) == [dataclasses.asdict(w) for w in expected[:4]]  # punctuation left out
        else:
            assert body.count("-->") == 4 and ("WEBVTT" in body) == (suffix == ".vtt")  # "." gets no cue
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("args, message", [
    (["--lang", "xx-yy"], "--lang: unknown language 'xx-yy'"),
    (["--timestamps", "words.txt"], "--timestamps must end in one of .json, .srt, .vtt"),
])
def test_cli_rejects_bad_lang_and_timestamps_suffix(model_dir, tmp_path, capsys, args, message):
    from anetts.cli import main

    out = tmp_path / "o.wav"
    assert main(["speak", "Hello.", "--voice", "syn_a", "--model-dir", str(model_dir), "-o", str(out), *args]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_text_chunk_predicted_too_long_is_split_at_words_and_keeps_their_times(tts):
    """A chunk that fits by the estimate but overflows 3 s is split at words; no word loses its time."""
    from anetts.models.kokoro.runtime import KokoroRuntime

    runtime = KokoroRuntime(tts.artifacts, tts.backend, tokens_per_second=40.0)  # a far too optimistic estimate
    text = "I read it; wind the clock!"
    r = runtime.synthesize(text, voice="syn_a", speed=0.5)
    assert len(r.chunks) >= 2 and all(c.frames <= tts.max_frames for c in r.chunks)
    assert [w.word for w in r.words] == [w.text for w in frontend("a").words(text) if w.phonemes]
    assert all(c.words for c in r.chunks)
    times = [t for w in r.words for t in (w.start_time, w.end_time)]
    assert times == sorted(times) and times[-1] <= r.seconds
