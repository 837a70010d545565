"""Phonemes -> ids and generic chunking (anetts.models.kokoro.text), with the English frontend as the G2P."""

import logging
import re
from pathlib import Path

import pytest

from anetts.models.kokoro import text as T
from anetts.models.kokoro.frontend import phonemize

CONFIG = Path(__file__).resolve().parents[1] / "anetts" / "models" / "kokoro" / "data" / "kokoro-82m.config.json"

PARAGRAPH = (
    "The quick brown fox jumps over the lazy dog. It was 3:45 p.m., and the sun — low and "
    "orange — lit the hills; nobody noticed. Why would they? Everyone was asleep… except "
    "for Dr. Smith, who paid $12.50 for a “very” expensive (and cold) coffee!"
)


@pytest.fixture(scope="module")
def vocab():
    return T.load_vocab(CONFIG)


def _squash(s: str) -> str:
    return re.sub(r"\s+", "", s)


def test_phonemize_offline_gives_known_symbols(vocab, caplog):
    ps = phonemize("Hello world! How are you today?")
    assert "həlˈO" in ps and "\n" not in ps
    with caplog.at_level(logging.WARNING, logger="anetts.models.kokoro.text"):
        ids, dropped = T.tokenize(phonemize(PARAGRAPH), vocab)
    assert dropped == [] and not [r for r in caplog.records if r.name == "anetts.models.kokoro.text"]
    assert len(ids) > 100 and all(0 < i < 178 for i in ids)  # unwrapped: no 0 pad ids


def test_tokenize_drops_unknown_symbols_with_warning(vocab, caplog):
    with caplog.at_level(logging.WARNING, logger="anetts.models.kokoro.text"):
        ids, dropped = T.tokenize("həl\nˈO#", vocab)
    assert dropped == ["\n", "#"]
    assert ids == [vocab[c] for c in "həlˈO"]
    assert "'#'" in caplog.text and "U+000A" in caplog.text


@pytest.mark.parametrize("ps, why", [("#@%", "no symbol is in the model vocab"), ("... !", "only punctuation")])
def test_tokenize_nothing_to_speak(vocab, ps, why):
    with pytest.raises(ValueError, match=why):
        T.tokenize(ps, vocab)


@pytest.mark.parametrize("text, why", [("", "empty"), ("  \n\t ", "whitespace"), ("... ?! —", "punctuation only")])
def test_empty_or_punctuation_only_text(text, why):
    with pytest.raises(ValueError, match=why):
        T.chunk_text(text, 100, phonemize_fn=lambda t: t)


def test_short_text_is_one_chunk():
    (chunk,) = T.chunk_text("Hello world! How are you?", 510, phonemize)
    assert chunk.text == "Hello world! How are you?" and chunk.phonemes == phonemize(chunk.text)


@pytest.mark.parametrize("limit", [40, 60, 120, 510])
def test_chunking_real_g2p_fits_and_keeps_order(limit):
    text = " ".join([PARAGRAPH] * 3)
    chunks = T.chunk_text(text, limit, phonemize)
    assert all(0 < len(c.phonemes) <= limit and c.text.strip() for c in chunks)
    assert _squash("".join(c.text for c in chunks)) == _squash(text)
    if limit == 510:
        assert len(chunks) >= 2  # ~600 phonemes
        assert all(c.text[-1] in ".!?…" for c in chunks[:-1])  # cut at sentence ends when possible


def _letters(t: str) -> str:
    return t  # fake G2P: one phoneme per character, deterministic and fast


def test_chunking_prefers_sentences_then_clauses_then_words():
    text = "Aa bb. Cc dd, ee ff. Gg hh ii jj kk."
    # sentence 2 is split at its comma, sentence 3 at words; neighbours are packed greedily
    assert T.split_text(text, 12, _letters) == ["Aa bb.", "Cc dd,", "ee ff. Gg hh", "ii jj kk."]
    assert T.split_text(text, 20, _letters) == ["Aa bb. Cc dd, ee ff.", "Gg hh ii jj kk."]


def test_abbreviations_do_not_end_sentences():
    text = "Hi. Dr. Smith met J. Doe. Bye!"
    assert T.split_text(text, 21, _letters) == ["Hi.", "Dr. Smith met J. Doe.", "Bye!"]


def test_long_word_and_tiny_limits():
    chunks = T.chunk_text("hi supercalifragilistic yo", 5, _letters)
    assert all(len(c.phonemes) <= 5 for c in chunks)
    assert _squash("".join(c.text for c in chunks)) == "hisupercalifragilisticyo"
    # a single symbol's phonemes longer than the limit are cut
    chunks = T.chunk_text("x", 2, lambda t: "ˈɛks")
    assert [c.phonemes for c in chunks] == ["ˈɛ", "ks"]


def test_callable_limit_and_phoneme_limit():
    assert T.phoneme_limit() == 510
    assert T.phoneme_limit(max_tokens=64) == 62
    assert T.phoneme_limit(max_seconds=10) == 158  # 16 tokens/s minus the wrap
    assert T.phoneme_limit(max_tokens=128, max_seconds=30) == 126
    with pytest.raises(ValueError):
        T.phoneme_limit(max_tokens=2)
    vowels = lambda ps: sum(c in "aeiou" for c in ps) <= 4  # noqa: E731
    chunks = T.chunk_text("one two three four five six seven.", vowels, _letters)
    assert all(vowels(c.phonemes) for c in chunks) and len(chunks) == 4
