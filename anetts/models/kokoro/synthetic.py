"""Synthetic Kokoro checkpoints in the upstream layout (see weights.py for the layout).

Tensors are drawn from per-module statistics of the real checkpoint (data/weight_stats.json),
then the model is calibrated so durations, F0 and loudness look like real speech. Only the
`synthetic` weights source uses this module, so editing it never re-copies real weights.
"""
from __future__ import annotations

import contextlib

import json
import math
import re
from pathlib import Path

import numpy as np
import torch

from anetts.models.kokoro.presets import DATA_DIR, preset_config
from anetts.models.kokoro.weights import (CHECKPOINT_NAME, COMPONENTS, CONFIG_NAME, VOICE_SHAPE, VOICES_DIR,
                                          WeightsError, init_kmodel)

# Synthetic voice names: clearly not upstream's (af_heart, ...), so nobody mistakes them.
SYNTHETIC_VOICES = ("syn_a", "syn_b")
# Real Kokoro-82M predicts ≈2.8 frames per token (kokoro-82m/activation_ranges.json).
TARGET_FRAMES_PER_TOKEN = 2.8
# Voiced F0 of an adult speaker, Hz; real F0_proj spans 10..338 Hz on the reference sentence.
TARGET_F0_MEAN, TARGET_F0_STD = 170.0, 55.0
# Real audio peaks at 0.39 on the reference sentence; a stats-drawn vocoder is ~30x louder.
TARGET_AUDIO_ABSMAX = 0.39

def _stats_key(name: str) -> str:
    return re.sub(r"\.\d+(?=\.|$)", ".N", name)


def _init_from_stats(model, rng: torch.Generator) -> int:
    """Draw every tensor from the real weights' per-group mean/std (clipped to abs-max).

    Returns how many tensors had statistics. Tensors without statistics keep upstream's init.
    """
    stats = json.loads((DATA_DIR / "weight_stats.json").read_text(encoding="utf-8"))
    matched = 0
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            st = stats.get(_stats_key(name))
            if st is None or not tensor.is_floating_point():
                continue
            matched += 1
            draw = torch.randn(tensor.shape, generator=rng, dtype=torch.float64)
            value = st["mean"] + st["std"] * draw
            limit = max(st["absmax"], abs(st["mean"]))
            tensor.copy_(value.clamp(-limit, limit).to(tensor.dtype))
    return matched


def _calibration_batch(config: dict, rng: np.random.Generator, n: int = 4, length: int = 48):
    symbols = sorted(i for i in config["vocab"].values() if i > 16)  # letters and IPA, not punctuation
    space = config["vocab"].get(" ", 16)
    batch = []
    for _ in range(n):
        ids = rng.choice(symbols, size=length)
        ids[rng.random(length) < 0.18] = space
        batch.append([0, *ids.tolist(), 0])
    return batch


def _durations_and_f0(model, ids: list[int], ref_s: torch.Tensor):
    """Upstream forward up to F0, returning (summed sigmoid durations, F0)."""
    input_ids = torch.tensor([ids])
    n = input_ids.shape[1]
    lengths = torch.tensor([n])
    text_mask = torch.zeros(1, n, dtype=torch.bool)
    bert = model.bert(input_ids, attention_mask=(~text_mask).int())
    d_en = model.bert_encoder(bert).transpose(-1, -2)
    s = ref_s[:, 128:]
    d = model.predictor.text_encoder(d_en, s, lengths, text_mask)
    x, _ = model.predictor.lstm(d)
    logits = model.predictor.duration_proj(x)
    dur = torch.round(torch.sigmoid(logits).sum(-1)).clamp(min=1).long().squeeze(0)
    idx = torch.repeat_interleave(torch.arange(n), dur)
    en = d.transpose(-1, -2)[:, :, idx]
    f0, _ = model.predictor.F0Ntrain(en, s)
    return logits, f0


@torch.no_grad()
def _calibrate(model, config: dict, voice: torch.Tensor, rng: np.random.Generator) -> dict:
    """Shift duration and F0 projections so the synthetic model behaves like the real one.

    A stats-drawn model predicts durations far from real ones (a default random init gives
    ≈25 frames/token, overflowing every bucket); durations and F0 drive bucket choice and
    the fp16 ranges the build cares about, so both are pinned to realistic values.
    """
    batch = _calibration_batch(config, rng)
    ref_s = voice[len(batch[0]) - 3]
    logits = torch.cat([_durations_and_f0(model, ids, ref_s)[0] for ids in batch], dim=1)

    def mean_frames(shift: float) -> float:
        return float(torch.sigmoid(logits + shift).sum(-1).round().clamp(min=1).mean())

    lo, hi = -60.0, 60.0
    for _ in range(60):  # bisection: mean frames is monotonic in the shift
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_frames(mid) < TARGET_FRAMES_PER_TOKEN else (lo, mid)
    shift = (lo + hi) / 2
    model.predictor.duration_proj.linear_layer.bias += shift

    f0 = torch.cat([_durations_and_f0(model, ids, ref_s)[1].flatten() for ids in batch])
    scale = TARGET_F0_STD / max(float(f0.std()), 1e-6)
    proj = model.predictor.F0_proj
    proj.weight *= scale
    proj.bias.copy_((proj.bias - float(f0.mean())) * scale + TARGET_F0_MEAN)
    f0 = torch.cat([_durations_and_f0(model, ids, ref_s)[1].flatten() for ids in batch])

    # The waveform is linear in exp(magnitude logits): a bias shift scales it exactly.
    from anetts.models.kokoro.reference import upstream_intermediates

    audio = upstream_intermediates(model, batch[0], ref_s)["audio"]
    gain = math.log(TARGET_AUDIO_ABSMAX / float(np.abs(audio).max()))
    bins = model.decoder.generator.post_n_fft // 2 + 1
    post = model.decoder.generator.conv_post
    post.bias[:bins] += gain
    audio = upstream_intermediates(model, batch[0], ref_s)["audio"]
    return {
        "audio_absmax": float(np.abs(audio).max()),
        "duration_bias_shift": shift,
        "frames_per_token": _frames_after(model, batch, ref_s),
        "f0_mean_hz": float(f0.mean()),
        "f0_std_hz": float(f0.std()),
    }


def _frames_after(model, batch, ref_s) -> float:
    frames = [_durations_and_f0(model, ids, ref_s)[0] for ids in batch]
    durs = [torch.sigmoid(x).sum(-1).round().clamp(min=1) for x in frames]
    return float(torch.cat(durs, dim=1).mean())


def _synthetic_voices(style_dim_total: int, rng: torch.Generator) -> dict[str, torch.Tensor]:
    # A voice pack varies smoothly with phoneme count; a random walk over the 510 rows
    # gives that without claiming any real speaker's statistics.
    voices = {}
    for name in SYNTHETIC_VOICES:
        base = 0.25 * torch.randn(1, style_dim_total, generator=rng)
        walk = 0.01 * torch.randn(VOICE_SHAPE[0], style_dim_total, generator=rng).cumsum(0)
        voices[name] = (base + walk).unsqueeze(1).float().contiguous()
    return voices


# torch intra-op threads the synthesis runs with: the calibration's forward passes reduce in an
# order that depends on the thread count, so the checkpoint's bytes did (a test process whose
# earlier tests had set 1 thread synthesized other weights than the session's). Two is what every
# published synthetic figure was made with.
SYNTHESIS_THREADS = 2


@contextlib.contextmanager
def _torch_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def make_synthetic(out_dir: Path, preset: str, seed: int, scratch_dir: Path) -> dict:
    """Write a deterministic synthetic checkpoint in the upstream layout; returns a report."""
    with _torch_threads(SYNTHESIS_THREADS):
        return _make_synthetic(Path(out_dir), preset, seed, scratch_dir)


def _make_synthetic(out_dir: Path, preset: str, seed: int, scratch_dir: Path) -> dict:
    config = preset_config(preset)
    torch.manual_seed(seed)  # upstream's own init draws from the global RNG
    model = init_kmodel(config, scratch_dir)
    gen = torch.Generator().manual_seed(seed)
    matched = _init_from_stats(model, gen)
    voices = _synthetic_voices(2 * config["style_dim"], gen)
    report = _calibrate(model, config, voices[SYNTHETIC_VOICES[0]], np.random.default_rng(seed))
    (out_dir / VOICES_DIR).mkdir(parents=True, exist_ok=True)
    (out_dir / CONFIG_NAME).write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    checkpoint = {
        c: {f"module.{k}": v.clone() for k, v in getattr(model, c).state_dict().items()} for c in COMPONENTS
    }
    torch.save(checkpoint, out_dir / CHECKPOINT_NAME)
    for name, voice in voices.items():
        torch.save(voice, out_dir / VOICES_DIR / f"{name}.pt")
    report.update(preset=preset, seed=seed, tensors_from_stats=matched,
                  parameters=sum(p.numel() for p in model.parameters()))
    if not math.isfinite(report["frames_per_token"]):
        raise WeightsError("synthetic calibration produced non-finite durations")
    return report


