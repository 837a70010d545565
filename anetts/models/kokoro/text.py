"""Phonemes -> token ids for Kokoro, and the generic chunking of text or phonemes into pieces that fit.

Text -> phonemes is upstream's G2P per language (:mod:`anetts.models.kokoro.frontend`); this
module takes the G2P as a function, so it also chunks phonemes given directly.

Token ids from :func:`tokenize` are *not* wrapped: the runtime adds id 0 at both ends, as
upstream ``KModel.forward`` does (``[0, *ids, 0]``), so a chunk of ``n`` phonemes occupies
``n + 2`` tokens and the 512-token context holds at most 510 phonemes.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Union

from anetts.models.kokoro.timestamps import Word

logger = logging.getLogger(__name__)

MAX_TOKENS = 512  # Kokoro context (plbert max positions)
PAD_TOKENS = 2  # the id-0 wrap at both ends
MAX_PHONEMES = MAX_TOKENS - PAD_TOKENS  # 510
TOKENS_PER_SECOND = 16.0  # measured: 44..476 tokens for 2.8..27.4 s of audio (docs/ane-notes.md §4)

# Vocab symbols that carry no sound of their own (pauses/intonation only).
_SILENT_SYMBOLS = frozenset(' ;:,.!?—…"()“”')
_SENTENCE_END = ".!?…"
_CLOSERS = "\"'”’)]»"
# Japanese and Chinese mark sentences and clauses with full-width signs and write no spaces after them
_CJK_SENTENCE_END = "。！？"
_CJK_CLAUSE = "、，；："
_CJK_CLOSERS = "」』）】》”’"
_CJK = re.compile(r"[\u3000-\u30ff\u3400-\u9fff\uf900-\ufaff\uff00-\uffef]")
# A period after these does not end a sentence ("Dr. Smith", "e.g. this").
_ABBREVIATIONS = frozenset("mr. mrs. ms. dr. prof. st. mt. jr. sr. vs. e.g. i.e. cf. approx.".split())


# --------------------------------------------------------------------------------------------
# G2P and tokenization
# --------------------------------------------------------------------------------------------


def _normalize_space(text: str) -> str:
    return " ".join(text.split())


def _has_speech(text: str) -> bool:
    return any(ch.isalnum() for ch in text)


def speakable(phonemes: str) -> bool:
    """Whether ``phonemes`` hold a symbol with a sound of its own (not only pauses/punctuation)."""
    return any(ch not in _SILENT_SYMBOLS for ch in phonemes)


def load_vocab(config: Union[str, Path, dict]) -> dict[str, int]:
    """The ``vocab`` (symbol -> id) of a Kokoro config.json (path or parsed dict)."""
    if not isinstance(config, dict):
        config = json.loads(Path(config).read_text(encoding="utf-8"))
    return dict(config["vocab"])


def tokenize(phonemes: str, vocab: dict[str, int]) -> tuple[list[int], list[str]]:
    """Phoneme string -> (ids, dropped symbols), one id per character, unwrapped.

    Symbols missing from ``vocab`` are dropped with a warning naming them (upstream drops them
    silently). The runtime wraps ``ids`` as ``[0, *ids, 0]``. Raises ValueError if nothing
    speakable is left (no symbols known, or only punctuation/spaces).
    """
    ids: list[int] = []
    dropped: list[str] = []
    speakable = False
    for ch in phonemes:
        i = vocab.get(ch)
        if i is None:
            dropped.append(ch)
        else:
            ids.append(i)
            speakable = speakable or ch not in _SILENT_SYMBOLS
    if dropped:
        names = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in sorted(set(dropped)))
        logger.warning("dropped %d phoneme symbol(s) not in the model vocab: %s", len(dropped), names)
    if not speakable:
        what = "no symbol is in the model vocab" if not ids else "only punctuation/spaces are left"
        raise ValueError(f"phonemes {phonemes[:40]!r} give nothing to speak: {what}")
    return ids, dropped


# --------------------------------------------------------------------------------------------
# Chunking
# --------------------------------------------------------------------------------------------


def phoneme_limit(
    max_tokens: int = MAX_TOKENS,
    max_seconds: float | None = None,
    tokens_per_second: float = TOKENS_PER_SECOND,
) -> int:
    """Most phonemes per chunk that fit a ``max_tokens`` bucket and (estimated) ``max_seconds`` of audio.

    Both budgets count the 2 wrap tokens. The seconds budget is an estimate (~16 tokens/s for
    speech at speed 1); lower ``tokens_per_second`` for slower speech or a safety margin. The
    runtime must still check the predicted frames (``dsp.align`` raises on overflow).
    """
    limit = max_tokens - PAD_TOKENS
    if max_seconds is not None:
        limit = min(limit, math.floor(max_seconds * tokens_per_second) - PAD_TOKENS)
    if limit < 1:
        raise ValueError(f"budget of {max_tokens} tokens / {max_seconds} s leaves no room for phonemes")
    return limit


@dataclass(frozen=True)
class TextChunk:
    """One synthesis unit: its source text, phonemes (non-empty, within the limit) and, where the
    frontend has them (English), the words whose phonemes these are (for word timestamps)."""

    text: str
    phonemes: str
    words: tuple[Word, ...] = ()


Fits = Callable[[str], bool]


# after . ! ? … (optionally followed by closing quotes/brackets) and whitespace; after 。！？ (and their
# closing brackets) with or without it
_SENT_RE = re.compile(
    rf"(?<=[{re.escape(_SENTENCE_END)}])\s+|(?<=[{re.escape(_SENTENCE_END)}][{re.escape(_CLOSERS)}])\s+"
    rf"|(?<=[{_CJK_SENTENCE_END}])(?![{_CJK_CLOSERS}{_CJK_SENTENCE_END}])\s*"
    rf"|(?<=[{_CJK_SENTENCE_END}][{_CJK_CLOSERS}])(?![{_CJK_CLOSERS}])\s*")
# after , ; : followed by whitespace ("3:45" stays whole), after any em dash, and after 、，；：
_CLAUSE_RE = re.compile(rf"(?<=[,;:—])\s+|(?<=—)(?=\S)|(?<=[{_CJK_CLAUSE}])\s*")


def _join(a: str, b: str) -> str:
    """Two pieces of text back together: with a space, unless either side is Japanese or Chinese."""
    return f"{a}{b}" if (a and _CJK.match(a[-1])) or (b and _CJK.match(b[0])) else f"{a} {b}"


def _ends_with_abbreviation(piece: str) -> bool:
    last = piece.rsplit(None, 1)[-1]
    return last.lower() in _ABBREVIATIONS or re.fullmatch(r"[A-Z]\.", last) is not None


Words = Callable[[str], list[str]]


def _split_at(text: str, level: int, words_fn: Words = str.split) -> list[str]:
    """Split at level 0 sentence ends, 1 clause marks, 2 words (``words_fn``: spaces, or a language's
    segmenter where words are not spaced), 3 halves of the characters.

    Pieces without letters or digits (a lone "—", "...") are merged into their neighbour so
    every piece can be phonemized.
    """
    if level == 0:
        parts = []
        for p in _SENT_RE.split(text):
            if parts and _ends_with_abbreviation(parts[-1]):
                parts[-1] = _join(parts[-1], p)
            else:
                parts.append(p)
    elif level == 1:
        parts = _CLAUSE_RE.split(text)
    elif level == 2:
        parts = words_fn(text)
    else:
        mid = len(text) // 2
        parts = [text[:mid], text[mid:]] if mid else [text]
    merged: list[str] = []
    for p in (p.strip() for p in parts):
        if not p:
            continue
        if merged and (not _has_speech(p) or not _has_speech(merged[-1])):
            merged[-1] = f"{merged[-1]}{p}" if level == 3 else _join(merged[-1], p)
        else:
            merged.append(p)
    return merged


def _units(text: str, level: int, fits: Fits, phonemize_fn: Callable[[str], str],
           words_fn: Words = str.split) -> list[TextChunk]:
    """``text`` as an ordered list of chunks that each fit, splitting only as finely as needed."""
    ps = phonemize_fn(text)
    if fits(ps):
        return [TextChunk(text, ps)]
    while level <= 3:
        parts = _split_at(text, level, words_fn)
        if len(parts) > 1:
            deeper = level if level == 3 else level + 1  # keep halving characters
            return [u for p in parts for u in _units(p, deeper, fits, phonemize_fn, words_fn)]
        level += 1
    return cut_phonemes(text, ps, fits)


def cut_phonemes(text: str, ps: str, fits: Fits) -> list[TextChunk]:
    # Last resort (a single character whose phonemes exceed the limit): cut the phonemes.
    logger.warning("cutting the phonemes of %r (%d symbols) to fit the chunk limit", text, len(ps))
    out: list[TextChunk] = []
    while ps:
        n = 1
        while n < len(ps) and fits(ps[: n + 1]):
            n += 1
        if not fits(ps[:n]):
            raise ValueError(f"chunk limit admits not even one phoneme ({ps[0]!r})")
        out.append(TextChunk(text, ps[:n]))
        ps = ps[n:].lstrip()
    return out


def chunk_text(
    text: str,
    limit: Union[int, Fits],
    phonemize_fn: Callable[[str], str],
    words_fn: Words = str.split,
) -> list[TextChunk]:
    """Split ``text`` into ordered chunks whose phonemes fit ``limit``.

    ``limit`` is a phoneme count (see :func:`phoneme_limit` to combine the token bucket with an
    audio-seconds budget) or a predicate on a chunk's phoneme string. Text that fits is one
    chunk. Otherwise it is split at sentence ends (. ! ? … 。！？), then clause marks (, ; : — 、，；：),
    then words (``words_fn``; then characters), and neighbouring pieces are packed greedily back
    together, their phonemes joined by a space. Chunks are never empty and keep the text's order.

    The length counted is ``len(phonemes)``, an upper bound on the token count (tokenize may
    drop unknown symbols). Each piece is phonemized on its own, as upstream phonemizes each line.
    """
    if callable(limit):
        fits = limit
    else:
        max_len = int(limit)
        if max_len < 1:
            raise ValueError(f"phoneme limit must be >= 1, got {limit}")
        fits = lambda ps: len(ps) <= max_len  # noqa: E731
    clean = _normalize_space(text)
    if not clean:
        raise ValueError("text is empty or whitespace only; nothing to speak")
    if not _has_speech(clean):
        raise ValueError(f"text {clean[:40]!r} has no letters or digits (punctuation only); nothing to speak")

    chunks: list[TextChunk] = []
    for unit in _units(clean, 0, fits, phonemize_fn, words_fn):
        if chunks:
            last = chunks[-1]
            joined = f"{last.phonemes} {unit.phonemes}"
            if fits(joined):
                chunks[-1] = TextChunk(_join(last.text, unit.text), joined)
                continue
        chunks.append(unit)
    logger.debug("split %d characters into %d chunk(s)", len(clean), len(chunks))
    return chunks


def split_sentences(text: str) -> list[str]:
    """``text`` cut at sentence ends (. ! ? …, not after abbreviations), the sentences in order."""
    return _split_at(_normalize_space(text), 0) if text.strip() else []


def split_text(text: str, max_phonemes: int, phonemize_fn: Callable[[str], str]) -> list[str]:
    """The texts of :func:`chunk_text`'s chunks."""
    return [c.text for c in chunk_text(text, max_phonemes, phonemize_fn)]
