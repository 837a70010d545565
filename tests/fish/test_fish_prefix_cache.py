"""A cloned voice's system turn prefilled once (issue #42 item 3): greedy codes from the cached states
equal those of a whole prefill, on torch and mil; hits prefill fewer rows; the cap drops the least
recently used and 0 keeps none; the server prefills stored voices at start and new ones when made."""
from __future__ import annotations

import numpy as np
import pytest

from anetts.models.fish import prompt as P
from anetts.models.fish.prefix import PrefixCache, Snapshot, check_cache_mb, prefix_key
from anetts.runtime.errors import InputError
from anetts.runtime.speech import Reference

TEXT = "Hello there. How are you today?"
FRAMES = 10


@pytest.fixture(scope="module")
def runtimes(model_dir):
    import anetts

    return {b: anetts.load(model_dir, backend=b, threads=1) for b in ("torch", "mil")}


def _voice(tts, seed: int, frames: int = 40) -> Reference:
    from anetts.models.fish.reference import reference_codes

    return Reference(f"A reference, number {seed}.", reference_codes(tts.cfg, frames, seed=seed))


def _boundary(tts, voice: Reference) -> int:
    """B: the system turn's rows down to a whole prefill block."""
    L = P.encode(tts.cfg, [P.system_turn(tts.cfg, tts.tokenizer, voice.text, voice.codes)]).shape[1]
    return L // tts.prefill_tokens * tts.prefill_tokens


def _cached(tts, voice: Reference) -> bool:
    """Whether the voice's system turn, to its last whole block, is in the runtime's prefix cache."""
    rows = P.encode(tts.cfg, [P.system_turn(tts.cfg, tts.tokenizer, voice.text, voice.codes)])
    return prefix_key(rows[:, :_boundary(tts, voice)], tts.prefill_tokens) in tts.prefix_cache


def _speak(tts, voice, text: str = TEXT):
    return tts.synthesize(text, voice, temperature=0, max_frames=FRAMES)


@pytest.mark.parametrize("backend", ["torch", "mil"])
def test_codes_from_the_cached_prefix_equal_a_whole_prefill(runtimes, backend):
    tts = runtimes[backend]
    voice = _voice(tts, 1)
    B = _boundary(tts, voice)
    assert B >= 2 * tts.prefill_tokens  # the cache skips whole blocks here
    tts.set_prefix_cache_mb(0)
    whole = _speak(tts, voice)
    assert whole.timings["prefill_cached_rows"] == 0
    tts.set_prefix_cache_mb(64)
    first, second = _speak(tts, voice), _speak(tts, voice)
    assert first.timings["prefill_cached_rows"] == 0 and len(tts.prefix_cache) == 1  # kept on the way
    assert second.timings["prefill_cached_rows"] == B  # the second request starts at B
    assert second.timings["prefill_rows"] == first.timings["prefill_rows"] - B
    assert len(whole.codes) >= 4
    assert np.array_equal(first.codes, whole.codes) and np.array_equal(second.codes, whole.codes)
    sampled = [tts.synthesize(TEXT, voice, temperature=0.7, seed=5, max_frames=FRAMES).codes for _ in range(2)]
    tts.set_prefix_cache_mb(0)
    assert np.array_equal(sampled[1], tts.synthesize(TEXT, voice, temperature=0.7, seed=5, max_frames=FRAMES).codes)
    assert np.array_equal(sampled[0], sampled[1])


def test_later_text_chunks_start_from_the_cached_prefix(runtimes):
    tts = runtimes["torch"]
    voice = _voice(tts, 2)
    tts.set_prefix_cache_mb(64)
    text = "One two three four five. Six seven eight nine ten."
    chunks = tts.plan(text, voice.text, voice.codes, chunk_length=24)
    assert len(chunks) >= 2
    blocks = list(tts.stream(text, voice, temperature=0, max_frames=4, chunk_length=24))
    cached = [b.timings["prefill_cached_rows"] for b in blocks if b.is_chunk_end]
    B = _boundary(tts, voice)
    assert cached[0] == 0 and cached[1:] == [B] * (len(cached) - 1)  # per text chunk: the first one fills it


def test_a_prepared_voice_starts_cached_and_the_cap_drops_the_least_recently_used(runtimes):
    tts = runtimes["torch"]
    a, b = _voice(tts, 3), _voice(tts, 4)
    tts.set_prefix_cache_mb(64)
    assert tts.prepare_voice(a)
    prepared = _speak(tts, a)
    assert prepared.timings["prefill_cached_rows"] == _boundary(tts, a)  # its first request is a hit
    one = tts.decoder._state_bytes
    tts.set_prefix_cache_mb(-(-one // (1 << 20)))  # room for one snapshot (MiB): the older ones dropped
    assert len(tts.prefix_cache) == 1
    assert not tts.prepare_voice(b, evict=False)  # full: a stored voice at start does not drop another
    assert tts.prepare_voice(b) and len(tts.prefix_cache) == 1  # a new registration does
    dropped = _speak(tts, a)
    assert dropped.timings["prefill_cached_rows"] == 0  # a was dropped
    assert np.array_equal(prepared.codes, dropped.codes)  # prefilled alone, the prefix gives the same codes
    tts.set_prefix_cache_mb(0)
    assert len(tts.prefix_cache) == 0 and not tts.prepare_voice(a)
    assert _speak(tts, a).timings["prefill_cached_rows"] == 0 and len(tts.prefix_cache) == 0


def test_a_prefix_shorter_than_a_block_is_not_cached_and_bad_caps_are_named(runtimes):
    tts = runtimes["torch"]
    tts.set_prefix_cache_mb(64)
    rows = P.encode(tts.cfg, [P.system_turn(tts.cfg, tts.tokenizer, None, None)])[:, :tts.prefill_tokens - 1]
    assert not tts.decoder.prefill_prefix(rows) and len(tts.prefix_cache) == 0
    with pytest.raises(InputError, match="prefix_cache_mb must be an integer >= 0"):
        tts.set_prefix_cache_mb(-1)
    tts.set_prefix_cache_mb(0)


# ------------------------------------------------------------------------------------ the cache alone

def _snap(nbytes: int) -> Snapshot:
    return Snapshot((), 16, nbytes)


def test_the_cache_is_an_lru_bounded_by_bytes():
    cache = PrefixCache(1)  # 1 MiB
    third = (1 << 20) // 3
    for k in "abc":
        assert cache.put(k, _snap(third))
    assert cache.get("a") is not None  # a is now the most recently used
    assert cache.put("d", _snap(third))
    assert "b" not in cache and all(k in cache for k in "acd")
    assert not cache.put("big", _snap((1 << 20) + 1)) and "big" not in cache and len(cache) == 3
    assert not cache.fits(third) and cache.used_bytes == 3 * third
    cache.resize(0)
    assert len(cache) == 0 and not cache.enabled and not cache.put("e", _snap(1))
    assert (cache.hits, cache.misses) == (1, 0)


def test_keys_are_the_content_and_the_block():
    rows = np.arange(11 * 32, dtype=np.int64).reshape(11, 32)
    assert prefix_key(rows, 16) == prefix_key(rows.astype(np.int32), 16)
    assert prefix_key(rows, 16) != prefix_key(rows, 8)
    other = rows.copy()
    other[5, 31] += 1
    assert prefix_key(rows, 16) != prefix_key(other, 16)


@pytest.mark.parametrize("bad", [-1, 1.5, "8", True, None])
def test_bad_caps_are_named(bad):
    with pytest.raises(InputError, match="prefix_cache_mb must be an integer >= 0"):
        check_cache_mb(bad)


# ------------------------------------------------------------------------------------ the server

def test_the_server_prefills_stored_voices_at_start_and_new_ones_when_made(runtimes, model_dir, reference_clip,
                                                                           tmp_path):
    from anetts.models.fish import codec as C
    from anetts.serve import ServeConfig
    from anetts.serve.app import create_app
    from anetts.serve.voices import VoiceStore

    tts = runtimes["torch"]
    tts.set_prefix_cache_mb(0)
    voices = tmp_path / "voices"
    stored = VoiceStore(voices).create("stored", _voice(tts, 5), None)
    app = create_app(ServeConfig(model_dir, voice_dir=voices, max_frames=4, prefix_cache_mb=64), instances=[tts])
    assert _cached(tts, stored.reference) and tts.prefix_cache.max_bytes == 64 << 20
    speaker = app.state.speaker
    made = speaker.register(tts, "new", "A reference clip of mine.", reference_clip[1], C.SAMPLE_RATE)
    assert _cached(tts, made.reference)
    assert _speak(tts, made.reference).timings["prefill_cached_rows"] == _boundary(tts, made.reference)
    tts.set_prefix_cache_mb(0)


def test_the_workers_share_one_cache_so_a_voice_made_on_one_starts_the_others(runtimes, model_dir, reference_clip):
    """Each worker kept a cache of its own: a voice registered on one was prefilled again by every other."""
    import anetts
    from anetts.models.fish import codec as C
    from anetts.serve import ServeConfig
    from anetts.serve.app import create_app

    first, other = runtimes["torch"], anetts.load(model_dir, backend="torch", threads=1)
    first.set_prefix_cache_mb(0)
    app = create_app(ServeConfig(model_dir, max_frames=4, prefix_cache_mb=64, workers=2), instances=[first, other])
    assert other.prefix_cache is first.prefix_cache and first.prefix_cache.max_bytes == 64 << 20
    made = app.state.speaker.register(first, "mine", "A reference clip of mine.", reference_clip[1], C.SAMPLE_RATE)
    on_other = _speak(other, made.reference)  # the other worker's programs restore the first one's snapshot
    assert on_other.timings["prefill_cached_rows"] == _boundary(other, made.reference)
    first.set_prefix_cache_mb(0)  # the one cache: off for both
    whole = _speak(other, made.reference)
    assert whole.timings["prefill_cached_rows"] == 0 and np.array_equal(on_other.codes, whole.codes)


def test_the_cli_refuses_a_negative_cap_naming_it(capsys):
    from anetts.cli import main

    assert main(["serve", "--prefix-cache-mb", "-1"]) == 2
    assert "--prefix-cache-mb must be >= 0, got -1" in capsys.readouterr().err
