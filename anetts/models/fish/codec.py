"""The Fish S2 codec: upstream's modded DAC decoder, its `codec.pth`, synthetic codecs and their checks.

Upstream is fish-speech 0.1.0 `fish_speech/models/dac/modded_dac.py` (`DAC`) with its quantizer
`rvq.py` (`DownsampleResidualVectorQuantize`), built on descript-audio-codec's layers (Snake1d,
WNConv1d, the dac `ResidualVectorQuantize`). S2 Pro's codec is fish-speech's
`configs/modded_dac_vq.yaml`: 44.1 kHz, decoder rates [8, 8, 4, 2] after the quantizer's
[2, 2] upsampling, so one frame of 10 codes (semantic 0..4095, 9 residual codebooks 0..1023)
decodes to 2048 samples.

Import shims. modded_dac.py imports librosa, soundfile, hydra, omegaconf and audiotools at its top
and descript-audio-codec's package `__init__` imports audiotools (torchaudio, matplotlib, ...);
the decode path uses none of them except audiotools' `ml.BaseModel` (an `nn.Module` base class)
and `AudioSignal` (an annotation). `upstream()` imports the two upstream modules with stub modules
for what is not installed and `dac`, `dac.nn`, `dac.model` as namespace packages over the real
descript-audio-codec files, then removes the stubs from `sys.modules` again, so nothing else in
the process sees a fake librosa.

Weights layout: `codec.pth` is a torch state dict of the whole DAC (encoder, quantizer, decoder),
weight-normed convolutions as `weight_g`/`weight_v` (dac's WNConv1d) or
`conv.parametrizations.weight.original0/1` (modded_dac's CausalWNConv1d), as upstream's
`inference.load_model` reads it (a `state_dict` wrapper and a `generator.` prefix are unwrapped the
same way). Derived buffers (`*.freqs_cis`, `*.causal_mask`, sized by the training code's block
size) are dropped before loading. The codec's config is S2 Pro's, read from the installed
fish-speech's `modded_dac_vq.yaml`, unless `config.json` carries `anetts_codec_config` (the same
layout, `_target_`s left out): the tiny synthetic preset does, so that every weights source (a
local copy of it included) reads its codec with the one file every source fetches.

The voice-cloning encoder (reference audio -> codes for the prompt's system turn) runs on the
host in torch (upstream `DAC.encode`), not as a second Core ML stage: it runs once per reference
voice, not per generated frame, and its codes can be cached with the voice, so its speed does not
bound real time; its input is a whole reference clip of arbitrary length (10-30 s of audio), which
a bucketed static-shape package would have to pad to the longest bucket; and its quantizer is a
nearest-neighbour search over l2-normalised codebooks (an argmax over distances), whose ties an
fp16 graph would break differently from upstream and so change codes rather than degrade them.
A runtime without torch can take the codes precomputed (they are what a voice ships as).
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib
import importlib.machinery
import importlib.util
import math
import re
import sys
import types
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn

CODEC_NAME = "codec.pth"
CODEC_CONFIG_KEY = "anetts_codec_config"  # in config.json, for a codec that is not S2 Pro's
SAMPLES_PER_FRAME = 2048
SAMPLE_RATE = 44100
N_CODEBOOKS = 10  # semantic + 9 residual: the codes of one frame
DROPPED_BUFFERS = ("freqs_cis", "causal_mask")
# a voice-cloning reference: upstream's examples use 10-30 s; longer crowds the text out of the context
MAX_REFERENCE_SECONDS = 30.0
# the modules modded_dac.py / rvq.py import at their top that the decode path never calls
_UNUSED_IMPORTS = ("librosa", "soundfile", "hydra", "omegaconf")


class CodecError(ValueError):
    """A codec checkpoint or config that cannot be used; the message names the file and tensor."""


# ---------------------------------------------------------------------------------------
# Importing upstream
# ---------------------------------------------------------------------------------------

def _stub(name: str, path: str | None = None) -> types.ModuleType:
    m = types.ModuleType(name)
    # a spec, or transformers' availability checks (find_spec) raise on `__spec__ is None`
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=path is not None)
    if path is not None:
        m.__path__ = [path]
        m.__spec__.submodule_search_locations = [path]
    sys.modules[name] = m
    return m


@contextlib.contextmanager
def _shims():
    before = set(sys.modules)
    for name in _UNUSED_IMPORTS:
        if importlib.util.find_spec(name) is None:
            m = _stub(name)
            if name == "omegaconf":
                m.OmegaConf = type("OmegaConf", (), {})
    at = _stub("audiotools")
    at.AudioSignal = type("AudioSignal", (), {})
    at.STFTParams = type("STFTParams", (), {})
    at.ml = _stub("audiotools.ml")
    at.ml.BaseModel = nn.Module
    spec = importlib.util.find_spec("dac")  # locates the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("descript-audio-codec is not installed (pip install --no-deps descript-audio-codec==1.0.0)")
    root = Path(list(spec.submodule_search_locations)[0])
    for pkg, sub in (("dac", root), ("dac.nn", root / "nn"), ("dac.model", root / "model")):
        _stub(pkg, str(sub))
    try:
        yield
    finally:
        for name in set(sys.modules) - before:
            if name.split(".")[0] in ("audiotools", "dac", *_UNUSED_IMPORTS):
                del sys.modules[name]


@lru_cache(maxsize=1)
def upstream():
    """(modded_dac, rvq): fish-speech 0.1.0's codec modules on descript-audio-codec's layers."""
    with _shims():
        modded_dac = importlib.import_module("fish_speech.models.dac.modded_dac")
        rvq = importlib.import_module("fish_speech.models.dac.rvq")
    return modded_dac, rvq


# ---------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------

def s2_pro_config() -> dict:
    """fish-speech's configs/modded_dac_vq.yaml (S2 Pro's codec) as a plain dict."""
    import yaml

    spec = importlib.util.find_spec("fish_speech")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("fish-speech is not installed (pip install --no-deps fish-speech==0.1.0)")
    path = Path(list(spec.submodule_search_locations)[0]) / "configs" / "modded_dac_vq.yaml"
    return _strip_targets(yaml.safe_load(path.read_text(encoding="utf-8")))


def _strip_targets(value):
    """Drop hydra's `_target_`/`_partial_` keys; read `1e-5` as the float OmegaConf's loader makes
    of it (PyYAML's YAML 1.1 resolver leaves exponents without a dot as strings)."""
    if isinstance(value, dict):
        return {k: _strip_targets(v) for k, v in value.items() if k not in ("_target_", "_partial_")}
    if isinstance(value, list):
        return [_strip_targets(v) for v in value]
    if isinstance(value, str) and re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value):
        return float(value)
    return value


def tiny_config() -> dict:
    """S2 Pro's codec structure (every module, rates [2,4,8,8] / [8,8,4,2] + [2,2], 9 + 1
    codebooks) at small widths, for fish-tiny: semantic codebook 512 and residual 128 as the
    tiny AR's codebook_size (and the 4:1 ratio of S2 Pro's 4096:1024)."""
    cfg = s2_pro_config()
    cfg.update(encoder_dim=4, decoder_dim=64, encoder_transformer_layers=[0, 0, 0, 1],
               decoder_transformer_layers=[1, 0, 0, 0])
    cfg["transformer_general_config"].update(block_size=256)
    q = cfg["quantizer"]
    q.update(input_dim=64, codebook_size=128, semantic_codebook_size=512)
    for key in ("pre_module", "post_module"):
        q[key] = copy.deepcopy(q[key])
        q[key]["input_dim"] = 64
        q[key]["config"].update(block_size=256, n_layer=1, n_head=2, dim=64, intermediate_size=128, head_dim=32)
    return cfg


def read_codec_config(weights_dir: Path) -> dict:
    """config.json's `anetts_codec_config`, or S2 Pro's codec when it has none."""
    from anetts.models.fish.config import CONFIG_NAME, FishConfigError, read_config_json

    try:
        data = read_config_json(Path(weights_dir) / CONFIG_NAME)
    except FishConfigError as e:
        raise CodecError(str(e)) from e
    cfg = data.get(CODEC_CONFIG_KEY)
    if cfg is None:
        return s2_pro_config()
    if not isinstance(cfg, dict):
        raise CodecError(f"{Path(weights_dir) / CONFIG_NAME}: {CODEC_CONFIG_KEY} must be an object")
    return cfg


def _get(cfg: dict, *keys, where: str):
    v = cfg
    for k in keys:
        if not isinstance(v, dict) or k not in v:
            raise CodecError(f"{where}: codec config lacks `{'.'.join(keys)}`")
        v = v[k]
    return v


def check_config(cfg: dict, num_codebooks: int | None = None, codebook_size: int | None = None,
                 where: str = CODEC_CONFIG_KEY) -> None:
    """Raise naming the key when `cfg` does not decode 10-code frames to 2048 samples."""
    dec = math.prod(_get(cfg, "decoder_rates", where=where)) * math.prod(_get(cfg, "quantizer", "downsample_factor", where=where))
    if dec != SAMPLES_PER_FRAME:
        raise CodecError(f"{where}: decoder_rates x quantizer.downsample_factor upsample by {dec}, "
                         f"expected {SAMPLES_PER_FRAME} samples per frame")
    if _get(cfg, "sample_rate", where=where) != SAMPLE_RATE:
        raise CodecError(f"{where}: sample_rate {cfg['sample_rate']}, expected {SAMPLE_RATE}")
    if _get(cfg, "quantizer", "n_codebooks", where=where) + 1 != N_CODEBOOKS:
        raise CodecError(f"{where}: quantizer.n_codebooks {cfg['quantizer']['n_codebooks']} + the semantic one is not "
                         f"{N_CODEBOOKS} codes per frame")
    hop = math.prod(_get(cfg, "encoder_rates", where=where)) * 4  # upstream DAC.frame_length
    if hop != SAMPLES_PER_FRAME:
        raise CodecError(f"{where}: encoder_rates give a frame of {hop} samples, expected {SAMPLES_PER_FRAME}")
    latent = _get(cfg, "encoder_dim", where=where) * 2 ** len(cfg["encoder_rates"])
    if cfg.get("latent_dim", latent) != _get(cfg, "quantizer", "input_dim", where=where):
        raise CodecError(f"{where}: quantizer.input_dim {cfg['quantizer']['input_dim']} differs from the latent dim {latent}")
    if num_codebooks is not None and _get(cfg, "quantizer", "n_codebooks", where=where) + 1 != num_codebooks:
        raise CodecError(f"{where}: quantizer.n_codebooks {cfg['quantizer']['n_codebooks']} + the semantic one is not "
                         f"the AR's {num_codebooks} codebooks")
    if codebook_size is not None and _get(cfg, "quantizer", "semantic_codebook_size", where=where) != codebook_size:
        raise CodecError(f"{where}: quantizer.semantic_codebook_size {cfg['quantizer']['semantic_codebook_size']} is not "
                         f"the AR's codebook_size {codebook_size}")


def build_dac(cfg: dict) -> nn.Module:
    """Upstream's DAC from a config in the yaml's layout (what hydra's instantiate builds)."""
    from functools import partial

    md, rvq = upstream()

    def transformer(block: dict):
        return md.WindowLimitedTransformer(config=md.ModelArgs(**block["config"]),
                                           **{k: v for k, v in block.items() if k != "config"})

    q = dict(cfg["quantizer"])
    pre, post = q.pop("pre_module"), q.pop("post_module")
    quantizer = rvq.DownsampleResidualVectorQuantize(**q, pre_module=transformer(pre), post_module=transformer(post))
    kw = {k: v for k, v in cfg.items() if k not in ("quantizer", "transformer_general_config")}
    return md.DAC(**kw, quantizer=quantizer,
                  transformer_general_config=partial(md.ModelArgs, **cfg["transformer_general_config"]))


def _is_dropped(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in DROPPED_BUFFERS


def expected_tensors(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor `codec.pth` must hold for `cfg`, with its shape (built on the meta device)."""
    with torch.device("meta"):
        model = build_dac(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if not _is_dropped(k)}


# ---------------------------------------------------------------------------------------
# Reading and checking codec.pth
# ---------------------------------------------------------------------------------------

def read_state(path: Path) -> dict[str, torch.Tensor]:
    """codec.pth as upstream's load_model reads it: unwrap `state_dict`, strip `generator.`, drop buffers."""
    path = Path(path)
    if not path.is_file():
        raise CodecError(f"missing weight file: {path}")
    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:  # torch raises RuntimeError / UnpicklingError / EOFError for bad files
        raise CodecError(f"{path}: not a torch checkpoint ({type(e).__name__}: {e})") from e
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise CodecError(f"{path}: expected a state dict, got {type(state).__name__}")
    if any("generator." in k for k in state):
        state = {k.replace("generator.", ""): v for k, v in state.items() if "generator." in k}
    return {k: v for k, v in state.items() if not _is_dropped(k)}


def validate_codec(weights_dir: Path, num_codebooks: int | None = None, codebook_size: int | None = None,
                   check_values: bool = True) -> dict:
    """Check codec.pth against its config: the first missing, unexpected, mis-shaped or
    non-finite tensor is raised by name. Returns the config."""
    weights_dir = Path(weights_dir)
    cfg = read_codec_config(weights_dir)
    check_config(cfg, num_codebooks, codebook_size, f"{weights_dir / 'config.json'} codec")
    path = weights_dir / CODEC_NAME
    state, spec = read_state(path), expected_tensors(cfg)
    for name, shape in spec.items():
        if name not in state:
            raise CodecError(f"{path}: missing tensor {name}")
        if not isinstance(state[name], torch.Tensor):
            raise CodecError(f"{path}: {name} is a {type(state[name]).__name__}, not a tensor")
        if tuple(state[name].shape) != shape:
            raise CodecError(f"{path}: tensor {name} has shape {tuple(state[name].shape)}, expected {shape}")
        if not state[name].is_floating_point():
            raise CodecError(f"{path}: tensor {name} has dtype {state[name].dtype}, expected a float dtype")
    for name in state:
        if name not in spec:
            raise CodecError(f"{path}: unexpected tensor {name}")
    if check_values:
        for name, t in state.items():
            if not bool(torch.isfinite(t).all()):
                raise CodecError(f"{path}: tensor {name} contains NaN or inf")
    return cfg


def load_codec(weights_dir: Path) -> nn.Module:
    """Upstream's DAC with codec.pth loaded (every tensor, fp32), in eval mode."""
    weights_dir = Path(weights_dir)
    cfg = read_codec_config(weights_dir)
    model = build_dac(cfg)
    state = read_state(weights_dir / CODEC_NAME)
    result = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    missing = [k for k in result.missing_keys if not _is_dropped(k)]
    if missing or result.unexpected_keys:
        raise CodecError(f"{weights_dir / CODEC_NAME}: missing tensors {missing[:5]}, "
                         f"unexpected {list(result.unexpected_keys)[:5]}")
    model.codec_config = cfg  # CodecDecoder rebuilds from it
    return model.eval()


# ---------------------------------------------------------------------------------------
# Synthetic codecs
# ---------------------------------------------------------------------------------------

def _seed(seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/codec".encode()).digest()[:8], "little") & (2**63 - 1)


def write_synthetic_codec(out_dir: Path, cfg: dict, seed: int) -> dict:
    """codec.pth with upstream's own initialisation (truncated-normal convolutions, weight norm
    g = |v|, LayerScale 1e-2, unit Snake alphas) drawn from `seed`; the state dict in the real
    layout. Then the parameters are perturbed a little (deterministic, per tensor) so that no
    norm gain, Snake alpha or layer scale is exactly its init constant: a swapped or ignored one
    shows up in parity."""
    out_dir = Path(out_dir)
    with torch.random.fork_rng(devices=[]):  # upstream's init draws from the global RNG: leave it as it was
        torch.manual_seed(_seed(seed))
        model = build_dac(cfg)
    state = {}
    for k, v in model.state_dict().items():
        if _is_dropped(k):
            continue
        if v.is_floating_point() and v.numel():
            g = torch.Generator().manual_seed(_seed(seed) ^ int.from_bytes(hashlib.sha256(k.encode()).digest()[:7], "little"))
            scale = float(v.abs().mean()) or 1.0
            v = v + 0.1 * scale * torch.randn(v.shape, generator=g)
        state[k] = v.contiguous()
    torch.save(state, out_dir / CODEC_NAME)
    return {"tensors": len(state), "parameters": sum(v.numel() for v in state.values())}


# ---------------------------------------------------------------------------------------
# Upstream decode and the traceable decoder
# ---------------------------------------------------------------------------------------

def max_reference_samples(cfg: dict) -> int:
    """The longest reference clip, in samples, this codec encodes: ``MAX_REFERENCE_SECONDS``, or less
    where a transformer on the encoding path would run out of positions. Each attends over at most
    its ``block_size`` positions (its rotary and mask tables) at its own hop: the encoder blocks' at
    the product of the strides up to their block, the quantizer's after its further downsampling.
    fish-tiny's encoder transformer has 256 positions at a hop of 512 samples: 2.97 s."""
    rates = [int(r) for r in _get(cfg, "encoder_rates", where="codec config")]
    layers = [int(n) for n in _get(cfg, "encoder_transformer_layers", where="codec config")]
    block = int(_get(cfg, "transformer_general_config", "block_size", where="codec config"))
    limits = [int(MAX_REFERENCE_SECONDS * SAMPLE_RATE)]
    limits += [block * math.prod(rates[: i + 1]) for i, n in enumerate(layers) if n > 0]
    q = _get(cfg, "quantizer", where="codec config")
    hop = math.prod(rates) * math.prod(int(f) for f in q.get("downsample_factor", [1]))
    limits += [int(q[k]["config"]["block_size"]) * hop for k in ("pre_module", "post_module") if q.get(k)]
    return min(limits)


def check_reference_audio(audio, sample_rate: int, max_samples: int | None = None) -> np.ndarray:
    """Mono float32 samples of a reference clip (channels averaged as upstream's inference does), or
    a CodecError naming what is wrong. Upstream resamples; this refuses another rate rather than
    pick a resampler whose output would differ from upstream's."""
    audio = np.asarray(audio)
    if audio.ndim == 2:  # (samples, channels), as soundfile reads it
        audio = audio.mean(axis=1)
    if audio.ndim != 1:
        raise CodecError(f"reference audio must be (samples,) or (samples, channels), got shape {audio.shape}")
    if int(sample_rate) != SAMPLE_RATE:
        raise CodecError(f"reference audio is {sample_rate} Hz; the codec takes {SAMPLE_RATE} Hz (resample it first)")
    if audio.size < SAMPLES_PER_FRAME:
        raise CodecError(f"reference audio has {audio.size} samples, less than one frame ({SAMPLES_PER_FRAME})")
    limit = int(MAX_REFERENCE_SECONDS * SAMPLE_RATE) if max_samples is None else max_samples
    if audio.size > limit:
        raise CodecError(f"reference audio is {audio.size / SAMPLE_RATE:.2f} s, longer than this model's "
                         f"{limit / SAMPLE_RATE:.2f} s ({limit} samples): cut it to a sentence or two")
    audio = audio.astype(np.float32)
    if not np.isfinite(audio).all():
        raise CodecError("reference audio contains NaN or inf")
    return audio


@torch.no_grad()
def upstream_encode(model: nn.Module, audio, sample_rate: int) -> np.ndarray:
    """Upstream `DAC.encode` of a reference clip -> codes (10, frames) int64 (the host encoder:
    see the module docstring for why it is not a Core ML stage)."""
    x = torch.from_numpy(check_reference_audio(audio, sample_rate, max_reference_samples(model.codec_config)))[None, None]
    codes, lengths = model.encode(x)
    return codes[0, :, : int(lengths[0])].numpy()


@torch.no_grad()
def upstream_decode(model: nn.Module, codes: np.ndarray) -> np.ndarray:
    """Upstream `DAC.decode` of codes (10, F) -> audio (2048·F,) float32, fp32 eager."""
    codes = torch.from_numpy(np.asarray(codes, np.int64))[None]
    audio, _ = model.decode(codes, torch.tensor([codes.shape[-1]]))
    return audio.reshape(-1).float().numpy()


class Snake(nn.Module):
    """dac's Snake1d (`x + 1/(alpha + 1e-9) · sin(alpha·x)²`) without its torch.jit.script function,
    which tracing would record as a call rather than as ops."""

    def __init__(self, alpha: torch.Tensor):
        super().__init__()
        self.alpha = nn.Parameter(alpha.detach().clone(), requires_grad=False)

    def forward(self, x):
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


def _fold_weight_norm(model: nn.Module) -> None:
    """Weight norm → plain weights (the same w = g·v/|v| upstream computes every call)."""
    from torch.nn.utils import parametrize

    for m in model.modules():
        if parametrize.is_parametrized(m, "weight"):
            parametrize.remove_parametrizations(m, "weight", leave_parametrized=True)
        elif hasattr(m, "weight_g") and hasattr(m, "weight_v"):
            torch.nn.utils.remove_weight_norm(m)


class CodecDecoder(nn.Module):
    """codes int32 (1, 1 + n_codebooks, F) -> audio (1, 2048·F): upstream's quantizer.decode and
    decoder, with weight norm folded, Snake1d as plain ops and the transformers' bf16 RoPE tables
    as fp32 copies of the same (bf16-rounded) values. Upstream clamps codes to each codebook's
    last index; this also clamps at 0 (upstream's embedding would raise on a negative code)."""

    def __init__(self, dac: nn.Module):
        super().__init__()
        # a copy to fold (not deepcopy: dac's old-style weight norm leaves a non-leaf `weight`)
        fresh = build_dac(dac.codec_config)
        fresh.load_state_dict(dac.state_dict())
        dac = fresh.float().eval()
        _fold_weight_norm(dac)
        md, _ = upstream()
        snake_cls = type(next(m for m in dac.modules() if type(m).__name__ == "Snake1d"))
        for parent in list(dac.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, snake_cls):
                    setattr(parent, name, Snake(child.alpha))
        for m in dac.modules():
            if isinstance(m, md.Transformer) and m.freqs_cis is not None:
                m.freqs_cis = m.freqs_cis.float()
        q = dac.quantizer
        self.semantic, self.residual = q.semantic_quantizer, q.quantizer
        self.post_module, self.upsample, self.decoder = q.post_module, q.upsample, dac.decoder
        self.semantic_max, self.residual_max = self.semantic.codebook_size - 1, self.residual.codebook_size - 1

    @staticmethod
    def _from_codes(rvq, codes):
        z = 0.0
        for i, vq in enumerate(rvq.quantizers):  # dac ResidualVectorQuantize.from_codes
            z = z + vq.out_proj(vq.decode_code(codes[:, i, :]))
        return z

    def forward(self, codes):
        codes = codes.long()
        semantic = codes[:, :1].clamp(0, self.semantic_max)
        residual = codes[:, 1:].clamp(0, self.residual_max)
        z = self._from_codes(self.semantic, semantic) + self._from_codes(self.residual, residual)
        z = self.upsample(self.post_module(z))
        return self.decoder(z).reshape(1, -1)
