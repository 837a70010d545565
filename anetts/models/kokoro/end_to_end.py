"""Kokoro end to end: the runtime over the compiled packages against upstream `KModel`.

Per text (phonemes): the runtime's `synthesize_tokens` (duration → f0ntrain → decoder_pre →
generator → host iSTFT, each stage the previous compiled stage's output) and upstream's
`forward_with_tokens` on the same ids and style row, with the runtime's source draws replayed
into upstream's SineGen — re-seeding torch does not reproduce them (its `randn_like` fills a
transposed memory order), so upstream's `torch.rand`/`randn_like` are swapped for the recorded
draws while it runs. The seed floor is upstream against itself with another draw: how close two
clips of one upstream can be, the yardstick for log-mel correlation.

Gate (``gate`` keys): ``durations_equal`` (every text's durations exact), ``min_waveform_snr_db``
(worst text), ``max_log_mel_corr_gap`` (worst text's correlation at most this far below its own
seed floor's).
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np
import torch

from anetts.models.kokoro import dsp
from anetts.models.kokoro.dsp import SourceDraws
from anetts.models.kokoro.weights import load_kmodel
from anetts.runtime.audio import log_mel_similarity
from anetts.metrics import compare

GATE_KEYS = ("durations_equal", "min_waveform_snr_db", "max_log_mel_corr_gap")


@contextlib.contextmanager
def replayed_draws(draws: SourceDraws):
    """Upstream's SineGen takes ``draws`` instead of torch's RNG (as tests/test_dsp.py does)."""
    real_rand, real_randn_like = torch.rand, torch.randn_like

    def fake_rand(*shape, **kw):
        if tuple(shape) != (1, dsp.N_HARMONICS):
            return real_rand(*shape, **kw)
        return torch.from_numpy(draws.rand_ini.astype(np.float32))[None].clone()

    def fake_randn_like(x, **kw):
        if x.shape[-1] == dsp.N_HARMONICS:  # SineGen's noise
            return torch.from_numpy(draws.sine_noise[: x.shape[1]])[None].to(x.dtype)
        return torch.zeros_like(x)  # SourceModuleHnNSF's noise branch, which Generator discards

    torch.rand, torch.randn_like = fake_rand, fake_randn_like
    try:
        yield
    finally:
        torch.rand, torch.randn_like = real_rand, real_randn_like


def waveform_snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    """SNR of `test` against `ref` over their common length (`anetts.metrics.compare`)."""
    n = min(np.size(ref), np.size(test))
    return compare(np.ravel(ref)[:n], np.ravel(test)[:n])["snr_db"]


class _F0Recorder:
    """The F0 curve each side computed: the runtime's f0ntrain output, upstream's F0_proj output."""

    def __init__(self, tts, kmodel):
        self.runtime: np.ndarray | None = None
        self.upstream: np.ndarray | None = None
        run = tts.backend.run

        def recording_run(stage, bucket, inputs):
            out = run(stage, bucket, inputs)
            if stage == "f0ntrain":
                self.runtime = np.array(out["F0_pred"]).reshape(-1)
            return out

        tts.backend.run = recording_run
        kmodel.predictor.F0_proj.register_forward_hook(
            lambda m, i, o: setattr(self, "upstream", o.detach().numpy().reshape(-1)))


def compare_texts(tts, kmodel, texts, seed: int, voice: str | None = None) -> list[dict]:
    """One row per phoneme string: durations, waveform SNR, log-mel similarity, F0 error, seed floor."""
    voice = voice or tts.default_voice
    pack = tts.voice_pack(voice)
    f0 = _F0Recorder(tts, kmodel)

    def upstream(ids, ref_s, draws):
        with replayed_draws(draws), torch.inference_mode():
            audio, dur = kmodel.forward_with_tokens(torch.tensor([ids]), torch.from_numpy(ref_s), 1.0)
        return audio.numpy().reshape(-1), dur.numpy().reshape(-1)

    rows = []
    for ps in texts:
        ids, dropped = tts._tokenize(ps)
        if dropped:
            raise ValueError(f"end-to-end text {ps!r}: phonemes not in the vocab: {dropped}")
        ref_s = tts.style_row(pack, len(ps))
        t0 = time.perf_counter()
        r = tts.synthesize_tokens(ids, ref_s=ref_s, seed=seed)
        runtime_s = time.perf_counter() - t0
        frames = int(r.pred_dur.sum())
        n = frames * dsp.KOKORO.samples_per_frame
        draws = SourceDraws.sample(n, np.random.default_rng(seed))  # what the runtime drew
        other = SourceDraws.sample(n, np.random.default_rng(seed + 1))
        a_up, d_up = upstream(ids, ref_s, draws)
        f0_up = f0.upstream
        a_floor, _ = upstream(ids, ref_s, other)
        f0_rt = f0.runtime[: f0_up.size]
        voiced = f0_up > 50.0
        sim, floor = log_mel_similarity(a_up, r.audio, dsp.SAMPLE_RATE), log_mel_similarity(a_up, a_floor, dsp.SAMPLE_RATE)
        same_length = d_up.size == r.pred_dur.size
        rows.append({
            "phonemes": ps, "tokens": len(ids), "frames": frames, "seconds": round(n / dsp.SAMPLE_RATE, 3),
            "buckets": r.buckets, "durations_equal": bool(same_length and np.array_equal(d_up, r.pred_dur)),
            "duration_mismatches": int(np.sum(d_up != r.pred_dur)) if same_length else None,
            "waveform_snr_db": waveform_snr_db(a_up, r.audio),
            "log_mel_corr": sim["log_mel_corr"], "log_mel_l1": sim["log_mel_l1"],
            "f0_rmse_hz_voiced": float(np.sqrt(np.mean((f0_rt[voiced] - f0_up[voiced]) ** 2))) if voiced.any() else None,
            "f0_max_abs_hz": float(np.max(np.abs(f0_rt - f0_up))),
            "seed_floor": {"waveform_snr_db": waveform_snr_db(a_up, a_floor), "log_mel_corr": floor["log_mel_corr"],
                           "log_mel_l1": floor["log_mel_l1"]},
            "runtime_seconds": round(runtime_s, 2),
        })
    return rows


def gate_rows(rows: list[dict], gate: dict) -> dict:
    """The gate's checks over all texts (``gate`` keys: GATE_KEYS)."""
    unknown = sorted(set(gate) - set(GATE_KEYS))
    if unknown:
        raise ValueError(f"end-to-end gate: unknown keys {unknown}; known: {list(GATE_KEYS)}")
    checks = {}
    if gate.get("durations_equal", True):
        checks["durations_equal"] = all(r["durations_equal"] for r in rows)
    if gate.get("min_waveform_snr_db") is not None:
        checks["waveform_snr_db"] = min(r["waveform_snr_db"] for r in rows) >= gate["min_waveform_snr_db"]
    if gate.get("max_log_mel_corr_gap") is not None:
        checks["log_mel_corr"] = all(r["seed_floor"]["log_mel_corr"] - r["log_mel_corr"] <= gate["max_log_mel_corr_gap"]
                                     for r in rows)
    return checks


def check_end_to_end(tts, weights_dir: Path, params: dict, gate: dict) -> dict:
    """`Family.check_end_to_end` for Kokoro (params: ``texts`` phoneme strings, ``seed``, ``voice``)."""
    texts = list(params.get("texts") or [])
    if not texts:
        raise ValueError("end-to-end check: no texts (families.kokoro.end_to_end.texts)")
    seed = int(params.get("seed", 0))
    rows = compare_texts(tts, load_kmodel(weights_dir), texts, seed, params.get("voice"))
    checks = gate_rows(rows, gate)
    return {
        "passed": all(checks.values()),
        "checks": checks,
        "gate": gate,
        "seed": seed,
        "worst": {
            "waveform_snr_db": min(r["waveform_snr_db"] for r in rows),
            "log_mel_corr_gap": max(r["seed_floor"]["log_mel_corr"] - r["log_mel_corr"] for r in rows),
        },
        "texts": rows,
    }
