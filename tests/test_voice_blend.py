"""Voice blends ("a(0.7)+b(0.3)") and sentence chunks for streaming, without a build."""
from __future__ import annotations

import pytest

from anetts.models.kokoro import text as T
from anetts.models.kokoro.blend import parse_blend
from anetts.runtime.errors import InputError


def test_blend_weights_are_normalized():
    assert parse_blend("af_heart") == [("af_heart", 1.0)]
    names, weights = zip(*parse_blend("jf_alpha(0.7)+jm_kumo(0.3)"))
    assert names == ("jf_alpha", "jm_kumo") and weights == pytest.approx((0.7, 0.3))
    names, weights = zip(*parse_blend(" af_bella(2) + af_sky "))
    assert names == ("af_bella", "af_sky") and weights == pytest.approx((2 / 3, 1 / 3))


@pytest.mark.parametrize("spec, named", [
    ("a(0)+b", "'a'"), ("a(-1)+b", "'a'"), ("a(nan)+b", "'a'"), ("a(inf)", "'a'"), ("a(x)", "'a'"),
    ("a+", "''"), ("a(1", "'a(1'"), ("a+a", "'a' is named more than once"), ("a b", "'a b'"),
])
def test_bad_blends_are_named(spec, named):
    with pytest.raises(InputError) as e:
        parse_blend(spec)
    assert named in str(e.value) and spec in str(e.value)


def test_sentences_split_at_their_ends():
    text = "One two. Three four! Dr. Five six? Seven, eight."
    assert T.split_sentences(text) == ["One two.", "Three four!", "Dr. Five six?", "Seven, eight."]
    assert T.split_sentences("  ") == []


def test_sentence_chunks_are_never_packed():
    from anetts.models.kokoro.frontend import frontend

    fe = frontend("a")
    text = "One two. Three four! Five six?"
    assert len(fe.chunks(text, 200)) == 1  # upstream's packing: one chunk
    assert [c.text for c in fe.chunks(text, 200, sentences=True)] == ["One two.", "Three four!", "Five six?"]


def test_blends_are_bounded_and_overflow_free():
    from anetts.models.kokoro.blend import MAX_SPEC_CHARS, MAX_TERMS

    assert [w for _, w in parse_blend("a(1e308)+b(1e308)")] == [0.5, 0.5]  # the sum would overflow to inf
    assert len(parse_blend("+".join(f"v{i}" for i in range(MAX_TERMS)))) == MAX_TERMS
    with pytest.raises(InputError, match=f"more than {MAX_TERMS} voices") as e:
        parse_blend("+".join(f"v{i}" for i in range(MAX_TERMS + 1)))
    assert len(str(e.value)) < 300
    with pytest.raises(InputError, match=f"longer than {MAX_SPEC_CHARS}") as e:
        parse_blend("a+" * 100_000 + "a")  # rejected before it is split, let alone checked for repeats
    assert len(str(e.value)) < 300 and "(200001 characters)" in str(e.value)
