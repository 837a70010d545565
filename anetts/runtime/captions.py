"""Word timestamps as a runtime gives them, and as files: JSON, SubRip (.srt) and WebVTT (.vtt).

A runtime whose ``capabilities.timestamps`` is true gives each chunk's words with their spans in
seconds from the start of the whole output (Kokoro: :mod:`anetts.models.kokoro.timestamps`, from the
duration stage); the CLI writes them with :func:`format_timestamps`, the server sends :func:`spoken`.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Sequence


@dataclass(frozen=True)
class WordTimestamp:
    """A word and its span in seconds from the start of the whole output audio."""

    word: str
    start_time: float
    end_time: float


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
