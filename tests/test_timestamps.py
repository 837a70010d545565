"""Word timestamps (anetts.models.kokoro.timestamps) against upstream `KPipeline.join_timestamps`."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from anetts.models.kokoro import frontend as F
from anetts.models.kokoro.timestamps import Word, word_timestamps
from anetts.runtime.captions import WordTimestamp, format_timestamps
from upstream_frontend import ENGLISH, LONG_ENGLISH, pipeline


def _upstream_times(tokens, pred_dur) -> list[WordTimestamp]:
    from kokoro import KPipeline

    tokens = copy.deepcopy(tokens)
    KPipeline.join_timestamps(tokens, torch.tensor(pred_dur))
    return [WordTimestamp(t.text, t.start_ts, t.end_ts) for t in tokens if t.start_ts is not None]


@pytest.mark.parametrize("text", [*ENGLISH, LONG_ENGLISH])
def test_times_equal_upstream_join_timestamps(text):
    rng = np.random.default_rng(len(text))
    for r in pipeline("a")(text):
        n = len(r.phonemes) + 2
        for pred_dur in (rng.integers(0, 12, n), rng.integers(1, 4, n), np.full(n, 2)):
            words = [Word(t.text, t.phonemes or "", t.whitespace) for t in r.tokens]
            expected = _upstream_times(r.tokens, pred_dur.tolist())
            assert word_timestamps(words, pred_dur) == expected
            shifted = word_timestamps(words, pred_dur, offset=1.5)
            assert [t for w in shifted for t in (w.start_time - 1.5, w.end_time - 1.5)] == pytest.approx(
                [t for w in expected for t in (w.start_time, w.end_time)])


def test_rule_each_span_is_its_phonemes_frames_and_times_are_monotonic():
    (chunk,) = F.frontend("a").chunks(ENGLISH[0])
    n = len(chunk.phonemes) + 2
    pred_dur = np.random.default_rng(0).integers(1, 9, n)
    times = word_timestamps(chunk.words, pred_dur)
    timed = [w for w in chunk.words if w.phonemes]
    assert [t.word for t in times] == [w.text for w in timed]
    total = pred_dur.sum() / 40
    i = 1
    for w, t in zip(timed, times):
        # start..end covers the word's own frames, half of the space before it and half of the one after
        frames = pred_dur[i:i + len(w.phonemes)].sum()
        after = pred_dur[i + len(w.phonemes)] if w.whitespace else 0
        assert t.end_time - t.start_time >= frames / 40 - 1e-9
        assert t.end_time - t.start_time <= (frames + after + pred_dur[i - 1]) / 40 + 1e-9
        i += len(w.phonemes) + (1 if w.whitespace else 0)
    starts = [t.start_time for t in times]
    ends = [t.end_time for t in times]
    assert starts == sorted(starts) and ends == sorted(ends)
    assert all(s <= e for s, e in zip(starts, ends)) and 0 <= starts[0] and ends[-1] <= total


def test_no_words_or_too_few_durations_give_no_times():
    words = [Word("Hi", "hˈI", "")]
    assert word_timestamps([], [1, 2, 3]) == []
    assert word_timestamps(words, [1, 2]) == []


def test_caption_files():
    words = [WordTimestamp("Hello", 0.1, 0.5), WordTimestamp(",", 0.5, 0.55), WordTimestamp("world", 0.6, 3725.0)]
    assert json.loads(format_timestamps(words, ".json")) == [
        {"word": "Hello", "start_time": 0.1, "end_time": 0.5}, {"word": "world", "start_time": 0.6, "end_time": 3725.0}]
    assert format_timestamps(words, ".SRT") == (
        "1\n00:00:00,100 --> 00:00:00,500\nHello\n\n2\n00:00:00,600 --> 01:02:05,000\nworld\n")
    assert format_timestamps(words, ".vtt") == (
        "WEBVTT\n\n00:00:00.100 --> 00:00:00.500\nHello\n\n00:00:00.600 --> 01:02:05.000\nworld\n")
    with pytest.raises(ValueError, match=r"\.json, \.srt, \.vtt, got '\.txt'"):
        format_timestamps(words, ".txt")


def test_caption_text_is_escaped_and_punctuation_left_out():
    from anetts.runtime.captions import spoken

    words = [WordTimestamp("x-->y", 0.0, 0.5), WordTimestamp("<b>&", 0.5, 1.0), WordTimestamp("—", 1.0, 1.1),
             WordTimestamp("a\n\nb", 1.1, 1.5)]
    vtt = format_timestamps(words, ".vtt")
    assert "x--&gt;y" in vtt and "&lt;b&gt;&amp;" in vtt and "-->y" not in vtt and "—" not in vtt
    assert vtt.count(" --> ") == 3 and "a b" in vtt  # one timing line per word, each cue one line
    srt = format_timestamps(words, ".srt")
    assert srt.count(" --> ") == 3 and "a b" in srt and "\n\n\n" not in srt
    assert [w.word for w in spoken(words)] == ["x-->y", "<b>&", "a\n\nb"]
