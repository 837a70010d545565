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

import json
from dataclasses import asdict, dataclass
from typing import Sequence

HALF_FRAMES_PER_SECOND = 80  # upstream's MAGIC_DIVISOR: 24000 Hz / 600 samples per frame * 2
LEAD_FRAMES = 3  # upstream drops this many frames of the leading pad's duration


@dataclass(frozen=True)
class Word:
    """One frontend token: its text, its phonemes ('' when unspoken) and the whitespace after it."""

    text: str
    phonemes: str
    whitespace: str


@dataclass(frozen=True)
class WordTimestamp:
    """A word and its span in seconds from the start of the whole output audio."""

    word: str
    start_time: float
    end_time: float


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


# ------------------------------------------------------------------------------------ files

CAPTION_SUFFIXES = (".json", ".srt", ".vtt")


def spoken(words: Sequence[WordTimestamp]) -> list[WordTimestamp]:
    """The words of ``words``: punctuation tokens carry times (upstream's rule) but are not words, not
    cues of a caption file and not entries of the server's timestamps."""
    return [w for w in words if any(ch.isalnum() for ch in w.word)]


def _cue_text(word: str, vtt: bool) -> str:
    """A word as one line of cue text: no line break (a blank line would end the cue), and for WebVTT
    ``&``, ``<`` and ``>`` escaped (its cue text is markup, and ``-->`` would start a timing line)."""
    line = " ".join(word.split())
    if vtt:
        line = line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return line


def _clock(seconds: float, sep: str) -> str:
    ms = max(0, int(round(seconds * 1000)))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def format_timestamps(words: Sequence[WordTimestamp], suffix: str) -> str:
    """``words`` as a file of the kind ``suffix`` names: .json (a list), .srt or .vtt (one cue per word);
    punctuation left out of each (:func:`spoken`)."""
    suffix = suffix.lower()
    if suffix == ".json":
        return json.dumps([asdict(w) for w in spoken(words)], ensure_ascii=False, indent=1) + "\n"
    if suffix == ".srt":
        cues = [f"{n}\n{_clock(w.start_time, ',')} --> {_clock(w.end_time, ',')}\n{_cue_text(w.word, False)}\n"
                for n, w in enumerate(spoken(words), 1)]
        return "\n".join(cues)
    if suffix == ".vtt":
        cues = [f"{_clock(w.start_time, '.')} --> {_clock(w.end_time, '.')}\n{_cue_text(w.word, True)}\n" for w in spoken(words)]
        return "\n".join(["WEBVTT\n", *cues])
    raise ValueError(f"timestamps file must end in one of {', '.join(CAPTION_SUFFIXES)}, got {suffix or 'no suffix'!r}")
