"""The Fish runtime on a fish-tiny build: greedy codes equal upstream's greedy generation on the same
prompt, seeded sampling is reproducible, the sampler is fish.md's definition, bad input is named,
long input is chunked, a full context goes on in a fresh one, and the codec windows join exactly."""
from __future__ import annotations

import numpy as np
import pytest

from anetts.models.fish import prompt as P
from anetts.models.fish.sampling import SamplingParams, SemanticSampler, filtered_probs, sample_logits
from anetts.runtime.speech import Reference

FRAMES = 40  # >= 32 frames of closed-loop greedy equality


@pytest.fixture(scope="module")
def tts_torch(model_dir):
    import anetts

    return anetts.load(model_dir, backend="torch", threads=1)


@pytest.fixture(scope="module")
def tts_mil(model_dir):
    import anetts

    return anetts.load(model_dir, backend="mil", threads=1)


@pytest.fixture(scope="module")
def greedy_case(fish_reference, tts_torch):
    """Upstream's greedy decode of a runtime-built prompt (system turn with reference codes, user text)."""
    from anetts.models.fish import reference as R

    model, cfg, _, _ = fish_reference
    rows = tts_torch.prompt("Hello there.", "A reference.", R.reference_codes(cfg, 8, seed=3))
    return rows, R.reference_decode(model, cfg, rows, FRAMES)


def _equal_frames(got: dict, ref: dict) -> np.ndarray:
    n = len(got["codes"])
    return (got["codes"] == ref["codes"][:n]).all(axis=1) & (got["semantic_tokens"] == ref["semantic_tokens"][:n])


def test_torch_backend_greedy_codes_equal_upstream(tts_torch, greedy_case):
    """The fp32 TorchScript exports in the runtime's loop: every code of 40 frames is upstream's."""
    rows, ref = greedy_case
    got = tts_torch.generate_codes(rows, FRAMES, temperature=0, stop_at_end=False)
    assert got["codes"].shape == (FRAMES, 10)
    eq = _equal_frames(got, ref)
    assert eq.all(), f"first divergent frame {int(np.argmin(eq))}"


def test_mil_backend_greedy_codes_follow_upstream_until_a_near_tie(tts_mil, greedy_case):
    """The fp16 packages: upstream's codes until one near-tie flips (fp16 vs fp32; measured: frame 16 of
    this prompt, codebook 1, upstream's top-2 fast logits 0.002 apart). The first difference must be
    such a tie: the code it picked is within 0.05 of upstream's best logit."""
    rows, ref = greedy_case
    got = tts_mil.generate_codes(rows, FRAMES, temperature=0, stop_at_end=False)
    eq = _equal_frames(got, ref)
    if eq.all():
        return
    f = int(np.argmin(eq))
    assert f >= 8, f"MIL decode diverged at frame {f}"
    if got["semantic_tokens"][f] != ref["semantic_tokens"][f]:
        logits = ref["slow_logits"][f]
        margin = logits[ref["semantic_tokens"][f]] - logits[got["semantic_tokens"][f]]
    else:
        c = int(np.argmax(got["codes"][f] != ref["codes"][f]))
        logits = ref["fast_logits"][f][c]
        margin = logits[ref["codes"][f][c]] - logits[got["codes"][f][c]]
    assert 0 <= margin < 0.05, f"frame {f}: not a near-tie (upstream margin {margin:.4f})"


def test_seeded_sampling_is_reproducible(tts_torch, greedy_case):
    rows, _ = greedy_case
    a = tts_torch.generate_codes(rows, 12, temperature=0.8, top_p=0.9, top_k=30, seed=7, stop_at_end=False)
    b = tts_torch.generate_codes(rows, 12, temperature=0.8, top_p=0.9, top_k=30, seed=7, stop_at_end=False)
    c = tts_torch.generate_codes(rows, 12, temperature=0.8, top_p=0.9, top_k=30, seed=8, stop_at_end=False)
    assert np.array_equal(a["codes"], b["codes"]) and np.array_equal(a["semantic_tokens"], b["semantic_tokens"])
    assert not np.array_equal(a["codes"], c["codes"])


# ------------------------------------------------------------------------- the sampler


def _direct_probs(logits, temperature, top_p, top_k):
    """fish.md §2 written out plainly: rank the logits, keep the best, then each next one while the
    temperature-1 softmax mass before it is within top_p and its rank is below top_k; softmax / T."""
    z = [float(v) for v in logits]
    n = len(z)
    k = n if top_k <= 0 or top_k > n else top_k
    order = sorted(range(n), key=lambda i: (-z[i], i))
    m = max(z)
    e = [np.exp(v - m) for v in z]
    total = sum(e)
    keep, cum = set(), 0.0
    for rank, i in enumerate(order):
        cum += e[i] / total
        if rank == 0 or (cum <= top_p and rank < k):
            keep.add(i)
    w = [z[i] / temperature if i in keep else -np.inf for i in range(n)]
    mw = max(w)
    p = np.array([np.exp(v - mw) for v in w])
    return p / p.sum()


@pytest.mark.parametrize("temperature, top_p, top_k", [(0.7, 0.7, 30), (1.0, 0.9, 30), (0.5, 1.0, 0), (1.3, 0.3, 5)])
def test_sampler_matches_the_definition(temperature, top_p, top_k):
    g = np.random.default_rng(0)
    logits = g.normal(0, 2, 200)
    logits[17] = -np.inf  # a biased-out row is never drawn
    want = _direct_probs(logits, temperature, top_p, top_k)
    np.testing.assert_allclose(filtered_probs(logits, temperature, top_p, top_k), want, rtol=1e-12, atol=1e-15)
    # the exponential race with the same uniforms: argmax(p / -log u)
    u = np.random.default_rng(5).uniform(1e-6, 1.0, size=logits.size)
    got = sample_logits(logits, temperature, top_p, top_k, np.random.default_rng(5))
    assert got == int(np.argmax(want / -np.log(u)))
    # and it draws from p: frequencies over many draws
    rng = np.random.default_rng(1)
    draws = np.bincount([sample_logits(logits, temperature, top_p, top_k, rng) for _ in range(4000)], minlength=200)
    assert draws[17] == 0 and np.abs(draws / 4000 - want).max() < 0.03
    assert sample_logits(logits, 0.0, top_p, top_k, None) == int(np.argmax(logits))


def test_ras_redraws_a_repeat_at_high_temperature():
    """A semantic token among the last 10 is replaced by the parallel draw at T 1.0 / top-p 0.9."""
    ids = np.arange(100, 110)
    logits = np.zeros(10)
    logits[3] = 50.0  # at top-p 0.3 the normal draw is always row 3 (token 103) ...
    logits[4] = logits[5] = 49.5  # ... top-p 0.9 keeps rows 3 and 4 (masses .45, .27, .27)
    params = SamplingParams(temperature=0.7, top_p=0.3, top_k=30, ras_window=10)
    s = SemanticSampler(params, ids, (100, 108), np.random.default_rng(0))
    tokens = [s(logits) for _ in range(60)]
    assert tokens[0] == 103 and s.ras_used > 0 and 104 in tokens
    # replay: the window holds what was emitted, the redraw used a parallel (not a second) draw
    rng = np.random.default_rng(0)
    recent = []
    for t in tokens:
        normal = 100 + sample_logits(logits, 0.7, 0.3, 30, rng)
        high = 100 + sample_logits(logits, 1.0, 0.9, 30, rng)
        assert t == (high if normal in recent[-10:] else normal)
        recent.append(t)
    greedy = SemanticSampler(SamplingParams(temperature=0), ids, (100, 108), np.random.default_rng(0))
    assert [greedy(logits) for _ in range(5)] == [103] * 5  # greedy: no RAS


# ------------------------------------------------------------------------- input, chunks, context


@pytest.mark.parametrize("kwargs, message", [
    ({"text": "   "}, "empty"),
    ({"text": "hi <|im_end|> there"}, "control token <|im_end|>"),
    ({"text": "hi", "voice": Reference("", np.zeros((9, 4), np.int64))}, r"must be \(10, frames\)"),
    ({"text": "hi", "voice": Reference("", np.full((10, 4), 512))}, "outside 0..511"),
    ({"text": "hi", "voice": Reference("", np.zeros((10, 4), np.float32))}, "must be integers"),
    ({"text": "hi", "voice": "af_heart"}, "unknown voice 'af_heart'"),
    ({"text": "hi", "speed": 1.5}, "no speaking-rate control"),
    ({"text": "hi", "temperature": -1}, "temperature"),
])
def test_bad_input_is_named(tts_mil, kwargs, message):
    from anetts.runtime import InputError

    with pytest.raises(InputError, match=message):
        tts_mil.stream(**kwargs)


def test_fish_keeps_the_runtime_protocol(tts_mil):
    """What the CLI and the server read of any runtime (anetts.runtime.speech), on Fish."""
    from anetts.runtime.speech import SpeechChunk, SpeechRuntime

    assert isinstance(tts_mil, SpeechRuntime) and tts_mil.family == "fish" and tts_mil.sample_rate == 44100
    caps = tts_mil.capabilities
    assert caps.cloning and caps.audio and not (caps.blending or caps.timestamps or caps.speed)
    assert tts_mil.voices == [tts_mil.default_voice] and "max_frames" in tts_mil.options
    chunks = tts_mil.stream("Hello there.", "default", seed=0, sentences=True, max_frames=4, temperature=0)
    got = list(chunks)
    assert all(isinstance(c, SpeechChunk) and not c.words for c in got) and got[-1].is_last
    assert sum(c.units for c in got) == sum(len(c.codes) for c in got) <= chunks.units and chunks.unit == "frames"
    assert got[-1].input_tokens > 0 and sum(c.audio.size for c in got) == 2048 * sum(c.units for c in got)


def test_make_voice_takes_a_clip_or_its_codes(tts_mil):
    from anetts.runtime import InputError

    with pytest.raises(InputError, match="exactly one"):
        tts_mil.make_voice("Ref.")
    voice = tts_mil.make_voice("Ref.", codes=np.zeros((10, 4), np.int64))
    assert voice.text == "Ref." and voice.codes.shape == (10, 4)


def test_long_text_is_chunked_upstreams_way(tts_mil):
    assert P.chunk_text("<|speaker:0|>Hi there. <|speaker:1|>Hello you.") == ["<|speaker:0|>Hi there.\n<|speaker:1|>Hello you."]
    text = " ".join(f"Sentence number {i} is here." for i in range(30))
    plans = tts_mil.plan(text, chunk_length=120)
    assert len(plans) > 1 and all(len(p.text.encode()) <= 120 for p in plans)
    assert " ".join(p.text for p in plans) == text
    # a reference that leaves too little room: the chunk is halved until its prompt fits
    ref = np.zeros((10, 60), np.int64)
    small = tts_mil.plan("One two three, four five six. Seven eight nine, ten eleven twelve.",
                         "A reference.", ref)
    assert len(small) > 1
    assert all(tts_mil._room(tts_mil.prompt(p.text, "A reference.", ref).shape[1]) >= 16 for p in small)


def test_a_full_context_goes_on_in_a_fresh_one(tts_mil):
    """More frames than the context holds: generation restarts in a fresh context (never truncated silently)."""
    ref = np.zeros((10, 40), np.int64)
    plan = tts_mil.plan("Hello there.", "A reference.", ref)[0]
    room = tts_mil._room(tts_mil.prompt(plan.text, "A reference.", ref).shape[1])
    want = room + 6
    blocks = list(tts_mil.stream("Hello there.", Reference("A reference.", ref), temperature=0, max_frames=want))
    end = blocks[-1]
    frames = sum(len(b.codes) for b in blocks)
    if end.stop == "im_end":  # the model ended its turn inside the context: nothing to restart
        assert frames < room
    else:
        assert frames == want and end.context_restarts >= 1 and end.stop == "max_frames"


# ------------------------------------------------------------------------- codec contract


def test_codec_windows_join_the_one_shot_decode(tts_torch, model_dir):
    """The build's codec stage (8-frame bucket: windows of 4 new frames after 4 of context) over 70
    frames, against upstream's codec decoding all 70 at once: every frame matches (torch: the fp32
    exports), so the window joins add nothing; a window without its context frames would not."""
    from anetts.models.fish import codec as C

    codes = np.random.default_rng(0).integers(0, 128, (70, 10))
    codes[:, 0] = np.random.default_rng(1).integers(0, 512, 70)  # codebook 0 spans the whole codebook
    one = C.upstream_decode(C.load_codec(model_dir / "weights"), codes.T).reshape(70, 2048)
    windowed = tts_torch.decode_audio(codes)
    assert windowed.shape == (70 * 2048,)
    err = (windowed.reshape(70, 2048) - one) ** 2
    per_frame_db = 10 * np.log10(np.sum(one ** 2, axis=1) / np.maximum(np.sum(err, axis=1), 1e-30))
    print(f"windowed codec vs upstream one-shot, per frame: {per_frame_db.min():.1f}..{per_frame_db.max():.1f} dB")
    assert per_frame_db.min() >= 80
    # the same frames decoded without the frames before them (a window with no context) differ
    cold = tts_torch.decode_audio(codes[4:12]).reshape(8, 2048)
    cold_db = 10 * np.log10(np.sum(one[4:12] ** 2) / np.sum((cold - one[4:12]) ** 2))
    assert cold_db < 40, f"context-free window matches too well ({cold_db:.1f} dB): the test shows nothing"


def without_codec(model_dir, dest):
    """A copy of the build whose manifest lists no codec stage (a build configured without one)."""
    import json
    import shutil

    shutil.copytree(model_dir, dest, ignore=shutil.ignore_patterns("codec", "codec.*", "export", "reference"))
    m = json.loads((dest / "manifest.json").read_text())
    m["packages"] = [p for p in m["packages"] if p["stage"] != "codec"]
    m["bundles"] = [b for b in m["bundles"] if b["stage"] != "codec"]
    m["stages"].pop("codec")
    (dest / "manifest.json").write_text(json.dumps(m))
    return dest


def test_cli_writes_codes_when_the_build_has_no_codec(model_dir, tmp_path, capsys):
    from anetts.cli import main

    out = tmp_path / "speech.wav"
    model_dir = without_codec(model_dir, tmp_path / "fish-tiny")
    rc = main(["speak", "Hello.", "-o", str(out), "--model-dir", str(model_dir), "--backend", "mil",
               "--max-frames", "6", "--threads", "1", "--no-progress"])
    printed = capsys.readouterr().out
    assert rc == 0 and "no codec stage" in printed
    codes = np.load(tmp_path / "speech.npy")
    assert codes.shape[1] == 10 and 1 <= codes.shape[0] <= 6 and not out.exists()


def test_cli_speaks_a_44k_wav(model_dir, tmp_path, capsys):
    import soundfile as sf

    from anetts.cli import main

    out = tmp_path / "speech.wav"
    rc = main(["speak", "Hello.", "-o", str(out), "--model-dir", str(model_dir), "--backend", "mil",
               "--max-frames", "6", "--threads", "1", "--no-progress"])
    printed = capsys.readouterr().out
    audio, rate = sf.read(str(out))
    assert rc == 0 and f"wrote {out}" in printed and rate == 44100
    assert audio.ndim == 1 and audio.size % 2048 == 0 and 1 <= audio.size // 2048 <= 6 and np.abs(audio).max() > 0
    assert not (tmp_path / "speech.npy").exists()


def test_audio_through_the_codec_stage(model_dir):
    """With the build's codec stage (bucketed, causal): streamed audio equals the runtime's one-shot
    decode sample for sample, and the windowed decode (8-frame buckets, 4 frames of context) matches
    upstream's codec over the whole utterance (torch: fp32 exports)."""
    import anetts

    tts = anetts.load(model_dir, backend="torch", threads=1)
    assert tts.has_codec  # fish-tiny builds one (config: models.fish-tiny.stages.codec)
    from anetts.models.fish import codec as C

    blocks = list(tts.stream("Hello there, this is a codec check.", temperature=0, max_frames=24))
    codes = np.concatenate([b.codes for b in blocks])
    streamed = np.concatenate([b.audio for b in blocks])
    one = tts.decode_audio(codes)
    assert one.shape == (codes.shape[0] * 2048,) and np.array_equal(streamed, one)
    up = C.upstream_decode(C.load_codec(model_dir / "weights"), codes.T)
    snr = 10 * np.log10(np.sum(up ** 2) / np.sum((up - one) ** 2))
    assert snr >= 80, f"windowed codec vs upstream: {snr:.1f} dB"


# ------------------------------------------------------------------- reference clip (host encoder)

def test_reference_clip_is_encoded_by_upstreams_encoder_and_clones(tts_torch, model_dir):
    from anetts.models.fish import codec as C

    upstream = C.load_codec(model_dir / "weights")
    codes = np.random.default_rng(0).integers(0, 128, size=(10, 5))
    codes[0] = np.random.default_rng(1).integers(0, 512, size=5)
    clip = C.upstream_decode(upstream, codes)  # 5 frames of audio the codec itself made
    got = tts_torch.encode_reference(clip, C.SAMPLE_RATE)
    assert got.shape == (10, 5) and got.dtype == np.int32
    np.testing.assert_array_equal(got, C.upstream_encode(upstream, clip, C.SAMPLE_RATE))
    stereo = np.stack([clip, clip], axis=1)  # (samples, channels) as soundfile reads it
    np.testing.assert_array_equal(tts_torch.encode_reference(stereo, C.SAMPLE_RATE), got)
    r = tts_torch.synthesize("Hello.", tts_torch.make_voice("A reference.", codes=got), temperature=0, max_frames=3)
    assert r.codes.shape[1] == 10 and 1 <= r.codes.shape[0] <= 3


@pytest.mark.parametrize("audio, rate, message", [
    (np.zeros(44100, np.float32), 24000, "24000 Hz; the codec takes 44100 Hz"),
    (np.zeros(31 * 44100, np.float32), 44100, "31.00 s, longer than this model's 2.97 s"),
    (np.zeros(100, np.float32), 44100, "less than one frame"),
    (np.full(4096, np.nan, np.float32), 44100, "NaN or inf"),
    (np.zeros((2, 2, 4096), np.float32), 44100, "must be \\(samples,\\) or \\(samples, channels\\)"),
])
def test_bad_reference_clips_are_named(tts_torch, audio, rate, message):
    from anetts.runtime import InputError

    with pytest.raises(InputError, match=message):
        tts_torch.encode_reference(audio, rate)


def test_cli_reference_audio_of_the_wrong_rate_exits_non_zero(model_dir, tmp_path, capsys):
    import soundfile as sf

    from anetts.cli import main

    wav = tmp_path / "ref.wav"
    sf.write(str(wav), np.zeros(22050, np.float32), 22050)
    out = tmp_path / "speech.wav"
    rc = main(["speak", "Hello.", "-o", str(out), "--model-dir", str(model_dir), "--backend", "mil",
               "--reference-audio", str(wav), "--reference-text", "Ref.", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1 and "22050 Hz; the codec takes 44100 Hz" in err and not out.exists()


def test_cli_refuses_kokoro_options_naming_them(model_dir, tmp_path, capsys):
    from anetts.cli import main

    out = tmp_path / "speech.wav"
    rc = main(["speak", "Hello.", "-o", str(out), "--model-dir", str(model_dir), "--backend", "mil",
               "--speed", "1.5", "--lang", "en-us", "--timestamps", str(tmp_path / "w.json"), "--no-progress"])
    assert rc == 2 and "--speed, --lang, --timestamps do not apply to this fish model" in capsys.readouterr().err
    assert not out.exists()


def test_cli_refuses_a_negative_seed(model_dir, tmp_path, capsys):
    from anetts.cli import main

    out = tmp_path / "speech.wav"
    rc = main(["speak", "Hello.", "-o", str(out), "--model-dir", str(model_dir), "--backend", "mil",
               "--seed", "-1", "--no-progress"])
    assert rc == 1 and "seed must be a non-negative integer, got -1" in capsys.readouterr().err
    assert not out.exists()


def test_bench_times_a_fish_build_per_stage_and_per_frame(model_dir, tmp_path, capsys):
    """`anetts bench` on a Fish build: every package function on its own (the slow chunks' prefill and
    decode, the fast AR's fused frame and stepped decode, on a fresh KV state), and greedy frames end to
    end with the per-frame parts, once with each fast-AR function."""
    import json

    from anetts.bench import validate_bench
    from anetts.cli import main
    from anetts.runtime.manifest import ModelArtifacts

    out = tmp_path / "bench.json"
    assert main(["bench", "--model-dir", str(model_dir), "--backend", "torch", "--iterations", "2", "--warmup", "0",
                 "--targets", "1", "-o", str(out)]) == 0
    assert "ms per frame" in capsys.readouterr().out
    r = validate_bench(json.loads(out.read_text()), str(out))
    assert (r["family"], r["backend"]) == ("fish", "torch")
    arts = ModelArtifacts.load(model_dir)
    rows = {s["label"]: s for s in r["stages"]}
    want = set()
    for stage, bucket in arts.packages:
        fns = {"slow_chunk": ("prefill", "decode"), "fast_ar": ("frame", "decode")}.get(stage.rstrip("0123456789"), (None,))
        want |= {f"{stage}/{bucket}" + (f":{fn}" if fn else "") for fn in fns}
    assert set(rows) == want
    assert all(rows[k]["stateful"] for k in want if k.startswith(("slow_chunk", "fast_ar")))
    assert not any(rows[k]["stateful"] for k in want if k.startswith("codec"))
    for s in rows.values():
        assert s["warm"]["n"] == 2 and 0 < s["warm"]["min_s"] <= s["warm"]["median_s"] and s["first_call_s"] > 0
    fused, stepped = r["end_to_end"]
    assert (fused["fast_ar_function"], stepped["fast_ar_function"]) == ("frame", "decode")
    for e2e in (fused, stepped):
        _check_e2e_row(e2e)
    assert r["upstream"]["cpu"]["available"] is False and "Fish" in r["upstream"]["cpu"]["reason"]


def _check_e2e_row(e2e: dict) -> None:
    from anetts.models.fish.runtime import FRAME_SECONDS

    assert e2e["target_s"] == 1 and e2e["frames"] == round(1 / FRAME_SECONDS)
    assert e2e["audio_s"] == pytest.approx(e2e["frames"] * FRAME_SECONDS)
    assert e2e["rtf_median"] == pytest.approx(e2e["warm"]["median_s"] / e2e["audio_s"])
    pf = e2e["per_frame_median_s"]
    assert set(pf) == {"sample", "fast", "slow", "frame"} and all(v > 0 for v in pf.values())
    assert pf["frame"] <= e2e["warm"]["median_s"] / e2e["frames"]  # the frames alone, without prefill and codec
    assert set(e2e["stages_median_s"]) == {"prefill", "sample", "fast", "slow", "codec"}


def test_bench_refuses_kokoro_settings_on_a_fish_build(model_dir, tmp_path, capsys):
    from anetts.cli import main

    out = tmp_path / "bench.json"
    assert main(["bench", "--model-dir", str(model_dir), "--backend", "torch", "--voice", "af_heart", "--speed", "1.2",
                 "-o", str(out)]) == 1
    assert "--voice, --speed: a Fish build has no voices, speed or language setting" in capsys.readouterr().err
    assert not out.exists()
