"""Word timestamps from the frontend's words and the duration stage's ``pred_dur``, as upstream does.

The rule is upstream ``kokoro.KPipeline.join_timestamps`` (kokoro 0.9.4): one ``pred_dur`` frame is
600 samples at 24 kHz (1/40 s), counted in half-frames so a space's frames split between the words
around it; the leading pad's duration minus 3 frames is the first word's start; a word with
phonemes spans ``len(phonemes)`` durations, then one more for its trailing space; a word without
phonemes only advances over its space. Words that get times are the ones upstream times
(punctuation included: misaki gives it phonemes such as ``,``).

Upstream writes the times onto misaki's mutable tokens; here they are returned, in seconds from the
start of the whole output audio (``offset`` is the chunk's start).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from anetts.runtime.captions import WordTimestamp

HALF_FRAMES_PER_SECOND = 80  # upstream's MAGIC_DIVISOR: 24000 Hz / 600 samples per frame * 2
LEAD_FRAMES = 3  # upstream drops this many frames of the leading pad's duration


@dataclass(frozen=True)
class Word:
    """One frontend token: its text, its phonemes ('' when unspoken) and the whitespace after it."""

    text: str
    phonemes: str
    whitespace: str


def word_timestamps(words: Sequence[Word], pred_dur: Sequence[int], offset: float = 0.0) -> list[WordTimestamp]:
    """Times of ``words`` (one chunk) from its ``pred_dur`` (frames per token, with both pads)."""
    durs = [int(d) for d in pred_dur]
    out: list[WordTimestamp] = []
    if not words or len(durs) < 3:  # at least <bos>, one token, <eos>
        return out
    left = right = 2 * max(0, durs[0] - LEAD_FRAMES)
    i = 1
    for w in words:
        if i >= len(durs) - 1:
            break
        if not w.phonemes:
            if w.whitespace:
                i += 1
                left = right + durs[i]
                right = left + durs[i]
                i += 1
            continue
        j = i + len(w.phonemes)
        if j >= len(durs):
            break
        start = left
        space = durs[j] if w.whitespace else 0
        left = right + 2 * sum(durs[i:j]) + space
        out.append(WordTimestamp(w.text, offset + start / HALF_FRAMES_PER_SECOND, offset + left / HALF_FRAMES_PER_SECOND))
        right = left + space
        i = j + (1 if w.whitespace else 0)
    return out
