"""Kokoro weights: the upstream on-disk layout, its validation, and synthetic checkpoints.

Layout of a weights directory (identical for every source):
    config.json          upstream model config (dims, istftnet, vocab)
    kokoro-v1_0.pth      dict {bert, bert_encoder, predictor, text_encoder, decoder} of state
                         dicts, keys prefixed `module.` as in the published checkpoint
    voices/<name>.pt     (510, 1, 256) fp32 style packs

The model itself is always upstream's `kokoro.model.KModel`; this module never re-implements it.
"""
from __future__ import annotations

import json
import logging
import math
import re
import warnings
from pathlib import Path

import numpy as np
import torch

from anetts.models.kokoro.presets import DATA_DIR, preset_config

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "kokoro-v1_0.pth"
CONFIG_NAME = "config.json"
VOICES_DIR = "voices"
COMPONENTS = ("bert", "bert_encoder", "predictor", "text_encoder", "decoder")
VOICE_SHAPE = (510, 1, 256)
# Synthetic voice names: clearly not upstream's (af_heart, ...), so nobody mistakes them.
SYNTHETIC_VOICES = ("syn_a", "syn_b")
# Real Kokoro-82M predicts ≈2.8 frames per token (kokoro-82m/activation_ranges.json).
TARGET_FRAMES_PER_TOKEN = 2.8
# Voiced F0 of an adult speaker, Hz; real F0_proj spans 10..338 Hz on the reference sentence.
TARGET_F0_MEAN, TARGET_F0_STD = 170.0, 55.0
# Real audio peaks at 0.39 on the reference sentence; a stats-drawn vocoder is ~30x louder.
TARGET_AUDIO_ABSMAX = 0.39


class WeightsError(ValueError):
    """A weights directory or checkpoint that cannot be used; the message names the culprit."""


def _quiet_kmodel(config: dict, checkpoint: Path):
    from kokoro.model import KModel

    with warnings.catch_warnings():
        # upstream's LSTM dropout / deprecated weight_norm warnings are noise for us
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        return KModel(repo_id="hexgrad/Kokoro-82M", config=config, model=str(checkpoint)).eval()


def init_kmodel(config: dict, scratch_dir: Path):
    """Upstream KModel with upstream's random init (an empty checkpoint loads nothing)."""
    empty = Path(scratch_dir) / "empty.pth"
    torch.save({}, empty)
    try:
        return _quiet_kmodel(config, empty)
    finally:
        empty.unlink(missing_ok=True)


def read_config(weights_dir: Path) -> dict:
    path = Path(weights_dir) / CONFIG_NAME
    if not path.is_file():
        raise WeightsError(f"missing weight file: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise WeightsError(f"{path} is not valid JSON: {e}") from e


def _strip_module_prefix(state: dict) -> dict:
    return {(k[7:] if k.startswith("module.") else k): v for k, v in state.items()}


def validate_checkpoint(config: dict, checkpoint: Path, scratch_dir: Path) -> None:
    """Check a checkpoint against the architecture of `config`, naming the first bad tensor.

    Upstream's loader falls back to `strict=False` and silently keeps random weights for
    anything missing, so a truncated checkpoint would otherwise build "fine".
    """
    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise WeightsError(f"missing weight file: {checkpoint}")
    try:
        loaded = torch.load(checkpoint, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for corrupt files
        raise WeightsError(f"cannot read checkpoint {checkpoint}: {e}") from e
    if not isinstance(loaded, dict):
        raise WeightsError(f"{checkpoint}: expected a dict of component state dicts")
    missing = [c for c in COMPONENTS if c not in loaded]
    extra = [c for c in loaded if c not in COMPONENTS]
    if missing or extra:
        raise WeightsError(f"{checkpoint}: missing components {missing}, unexpected components {extra}")
    reference = init_kmodel(config, scratch_dir)
    for component in COMPONENTS:
        want = getattr(reference, component).state_dict()
        got = _strip_module_prefix(loaded[component])
        for name in want:
            if name not in got:
                raise WeightsError(f"{checkpoint}: missing tensor {component}.{name}")
        for name, tensor in got.items():
            full = f"{component}.{name}"
            if name not in want:
                raise WeightsError(f"{checkpoint}: unexpected tensor {full}")
            if tuple(tensor.shape) != tuple(want[name].shape):
                raise WeightsError(
                    f"{checkpoint}: tensor {full} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(want[name].shape)}"
                )
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise WeightsError(f"{checkpoint}: tensor {full} contains NaN or inf")


def validate_voice(path: Path) -> torch.Tensor:
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"missing voice file: {path}")
    voice = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(voice, torch.Tensor) or tuple(voice.shape) != VOICE_SHAPE:
        shape = tuple(voice.shape) if isinstance(voice, torch.Tensor) else type(voice).__name__
        raise WeightsError(f"voice {path}: expected a tensor of shape {VOICE_SHAPE}, got {shape}")
    if not torch.isfinite(voice).all():
        raise WeightsError(f"voice {path} contains NaN or inf")
    return voice


def validate_weights_dir(weights_dir: Path, voices: list[str], scratch_dir: Path) -> dict:
    """Validate a weights directory; returns its config."""
    weights_dir = Path(weights_dir)
    config = read_config(weights_dir)
    for key in ("vocab", "n_token", "hidden_dim", "style_dim", "plbert", "istftnet"):
        if key not in config:
            raise WeightsError(f"{weights_dir / CONFIG_NAME}: missing key {key!r}")
    validate_checkpoint(config, weights_dir / CHECKPOINT_NAME, scratch_dir)
    for name in voices:
        validate_voice(weights_dir / VOICES_DIR / f"{name}.pt")
    return config


def load_kmodel(weights_dir: Path):
    """Upstream KModel in eval mode from a (validated) weights directory."""
    weights_dir = Path(weights_dir)
    return _quiet_kmodel(read_config(weights_dir), weights_dir / CHECKPOINT_NAME)


def list_voices(weights_dir: Path) -> list[str]:
    return sorted(p.stem for p in (Path(weights_dir) / VOICES_DIR).glob("*.pt"))


def load_voice(weights_dir: Path, name: str) -> torch.Tensor:
    path = Path(weights_dir) / VOICES_DIR / f"{name}.pt"
    if not path.is_file():
        raise WeightsError(f"unknown voice {name!r}; available: {list_voices(weights_dir)}")
    return validate_voice(path)


# ---------------------------------------------------------------------------------------
# Synthetic checkpoints
# ---------------------------------------------------------------------------------------

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


def make_synthetic(out_dir: Path, preset: str, seed: int, scratch_dir: Path) -> dict:
    """Write a deterministic synthetic checkpoint in the upstream layout; returns a report."""
    out_dir = Path(out_dir)
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


def prepare_for_trace(model):
    """Fold weight norm into plain weights: same values, a simpler traced graph."""
    from torch.nn.utils import remove_weight_norm

    for module in model.modules():
        if hasattr(module, "weight_g") and hasattr(module, "weight_v"):
            remove_weight_norm(module)
    return model.eval()


def host_dsp_params(weights_dir: Path) -> dict:
    """The hn-NSF merge layer (decoder.generator.m_source.l_linear), run on the host at runtime."""
    ckpt = torch.load(Path(weights_dir) / CHECKPOINT_NAME, map_location="cpu", weights_only=True)
    dec = _strip_module_prefix(ckpt["decoder"])
    return {
        "l_linear_weight": dec["generator.m_source.l_linear.weight"].double().tolist(),
        "l_linear_bias": dec["generator.m_source.l_linear.bias"].double().tolist(),
    }
