"""Fish S2 weights: the published checkpoint layout, its validation, and synthetic checkpoints.

Layout of a weights directory (identical for every source):
    config.json                    fish_qwen3_omni config (see config.py)
    model.safetensors.index.json   {"metadata": {"total_size"}, "weight_map": {tensor: shard}}
    model-0000k-of-0000n.safetensors  bf16 shards
    tokenizer.json                 HF tokenizers file (deterministic byte-level one for presets)
    codec.pth                      the modded DAC codec's state dict (codec.py); config.json's
                                   `anetts_codec_config` when it is not S2 Pro's (the tiny preset)

Tensor names are the checkpoint's: the slow AR under `text_model.model.`, the fast AR, the fast
embeddings and the codebook embeddings (used by the slow input!) under `audio_decoder.`.
Synthetic shards are streamed tensor by tensor, so memory stays at one tensor whatever the size.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import struct
import sys
from pathlib import Path

import torch

from anetts.artifacts import write_json
from anetts.models.fish import presets as _presets
from anetts.models.fish import tokenizer as tok
from anetts.models.fish.config import CONFIG_NAME, ARDims, FishConfig, FishConfigError, read_config_json

log = logging.getLogger(__name__)

INDEX_NAME = "model.safetensors.index.json"
SLOW_PREFIX = "text_model.model."
FAST_PREFIX = "audio_decoder."
DTYPE = torch.bfloat16
SAFETENSORS_DTYPE = "BF16"
HF_REPO = "fishaudio/s2-pro"
# Generation draws at most this many values at once (bounds the fp32 scratch of big tables).
_CHUNK_ELEMENTS = 1 << 24


class WeightsError(ValueError):
    """A weights directory that cannot be used; the message names the file or tensor."""


# ---------------------------------------------------------------------------------------
# The tensor spec: every checkpoint tensor, its shape, in checkpoint order
# ---------------------------------------------------------------------------------------

def layer_tensors(d: ARDims, prefix: str) -> dict[str, tuple[int, ...]]:
    """The tensors of one transformer block (fused wqkv rows: q, then k, then v)."""
    spec = {
        f"{prefix}attention.wqkv.weight": (d.q_size + 2 * d.kv_size, d.dim),
        f"{prefix}attention.wo.weight": (d.dim, d.q_size),
    }
    if d.qk_norm:
        spec[f"{prefix}attention.q_norm.weight"] = (d.head_dim,)
        spec[f"{prefix}attention.k_norm.weight"] = (d.head_dim,)
    spec.update({
        f"{prefix}feed_forward.w1.weight": (d.intermediate_size, d.dim),
        f"{prefix}feed_forward.w3.weight": (d.intermediate_size, d.dim),
        f"{prefix}feed_forward.w2.weight": (d.dim, d.intermediate_size),
        f"{prefix}attention_norm.weight": (d.dim,),
        f"{prefix}ffn_norm.weight": (d.dim,),
    })
    return spec


def slow_layer_prefix(i: int) -> str:
    return f"{SLOW_PREFIX}layers.{i}."


def checkpoint_spec(cfg: FishConfig) -> dict[str, tuple[int, ...]]:
    s, f = cfg.slow, cfg.fast
    spec = {f"{SLOW_PREFIX}embeddings.weight": (s.vocab_size, s.dim)}
    for i in range(s.n_layer):
        spec.update(layer_tensors(s, slow_layer_prefix(i)))
    spec[f"{SLOW_PREFIX}norm.weight"] = (s.dim,)
    if not s.tie_word_embeddings:
        spec[f"{SLOW_PREFIX}output.weight"] = (s.vocab_size, s.dim)
    spec[f"{FAST_PREFIX}codebook_embeddings.weight"] = (cfg.codebook_size * cfg.num_codebooks, s.dim)
    spec[f"{FAST_PREFIX}embeddings.weight"] = (cfg.codebook_size, f.dim)
    for i in range(f.n_layer):
        spec.update(layer_tensors(f, f"{FAST_PREFIX}layers.{i}."))
    spec[f"{FAST_PREFIX}norm.weight"] = (f.dim,)
    spec[f"{FAST_PREFIX}output.weight"] = (cfg.codebook_size, f.dim)
    return spec


# ---------------------------------------------------------------------------------------
# Reading a weights directory
# ---------------------------------------------------------------------------------------

def read_config(weights_dir: Path) -> FishConfig:
    path = Path(weights_dir) / CONFIG_NAME
    try:
        return FishConfig.from_dict(read_config_json(path), str(path))
    except FishConfigError as e:
        raise WeightsError(str(e)) from e


def read_index(weights_dir: Path) -> dict[str, str]:
    """tensor name -> shard file name, from the safetensors index."""
    path = Path(weights_dir) / INDEX_NAME
    if not path.is_file():
        raise WeightsError(f"missing weight file: {path}")
    try:
        wmap = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise WeightsError(f"{path}: not a safetensors index with a weight_map ({e})") from e
    for name, shard in wmap.items():
        if not isinstance(shard, str) or "/" in shard or shard.startswith("."):
            raise WeightsError(f"{path}: tensor {name} maps to an invalid shard name {shard!r}")
    return wmap


def shard_files(weights_dir: Path) -> list[str]:
    return sorted(set(read_index(weights_dir).values()))


def shard_header(path: Path) -> tuple[dict, int]:
    """The JSON header of a safetensors file (dtype, shape, offsets per tensor), without its data,
    and the file offset its data starts at (the tensors' offsets count from there)."""
    if not path.is_file():
        raise WeightsError(f"missing weight file: {path}")
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise WeightsError(f"{path}: truncated safetensors file")
        (n,) = struct.unpack("<Q", raw)
        if n > 100 << 20:
            raise WeightsError(f"{path}: implausible safetensors header length {n}")
        try:
            header = json.loads(fh.read(n))
        except json.JSONDecodeError as e:
            raise WeightsError(f"{path}: corrupt safetensors header ({e})") from e
    header.pop("__metadata__", None)
    return header, 8 + n


def validate_weights_dir(weights_dir: Path, check_values: bool = True) -> FishConfig:
    """Check config, index, every shard header against the spec, and (optionally) finite values.

    The first problem found is raised, naming the tensor: missing, unexpected, in another shard
    than the index says, wrong shape or wrong dtype; then NaN/inf, read one tensor at a time.
    """
    weights_dir = Path(weights_dir)
    cfg = read_config(weights_dir)
    spec = checkpoint_spec(cfg)
    wmap = read_index(weights_dir)
    for name in spec:
        if name not in wmap:
            raise WeightsError(f"{weights_dir / INDEX_NAME}: missing tensor {name}")
    for name in wmap:
        if name not in spec:
            raise WeightsError(f"{weights_dir / INDEX_NAME}: unexpected tensor {name}")
    for shard in sorted(set(wmap.values())):
        path = weights_dir / shard
        header, _ = shard_header(path)
        for name in (n for n, s in wmap.items() if s == shard):
            if name not in header:
                raise WeightsError(f"{path}: missing tensor {name} (the index places it in this shard)")
            entry = header[name]
            if tuple(entry["shape"]) != spec[name]:
                raise WeightsError(f"{path}: tensor {name} has shape {tuple(entry['shape'])}, expected {spec[name]}")
            if entry["dtype"] != SAFETENSORS_DTYPE:
                raise WeightsError(f"{path}: tensor {name} has dtype {entry['dtype']}, expected {SAFETENSORS_DTYPE}")
        for name in header:
            if wmap.get(name) != shard:
                raise WeightsError(f"{path}: unexpected tensor {name} (not indexed to this shard)")
    if check_values:
        from safetensors import safe_open

        for shard in sorted(set(wmap.values())):
            with safe_open(str(weights_dir / shard), framework="pt") as fh:
                for name in fh.keys():
                    if not _all_finite_bf16(fh.get_tensor(name)):
                        raise WeightsError(f"{weights_dir / shard}: tensor {name} contains NaN or inf")
    tok.load_tokenizer(weights_dir / tok.TOKENIZER_NAME, cfg)
    return cfg


def _all_finite_bf16(t: torch.Tensor) -> bool:
    """NaN/inf test on the bits (exponent all ones), in chunks: ~100x faster than torch.isfinite on
    bf16 here, and no full-size temporaries for the 400 M-element embedding table."""
    bits = t.contiguous().view(torch.int16).view(-1).numpy()
    for start in range(0, bits.size, _CHUNK_ELEMENTS):
        if ((bits[start:start + _CHUNK_ELEMENTS] & 0x7F80) == 0x7F80).any():
            return False
    return True


# ---------------------------------------------------------------------------------------
# Synthetic checkpoints
# ---------------------------------------------------------------------------------------

def _tensor_seed(seed: int, name: str) -> int:
    """One RNG stream per tensor: values do not depend on shard boundaries or generation order."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "little") & (2**63 - 1)


def _init_std(name: str, cfg: FishConfig) -> tuple[float, float]:
    """(mean, std) of a synthetic tensor: an LLM's init, norms near 1."""
    if name.endswith("norm.weight"):
        # near 1 like trained RMSNorm gains, but not exactly 1 so a swapped norm shows up
        return 1.0, 0.1
    std = cfg.slow.dim ** -0.5
    if name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
        # residual-branch outputs scaled down with depth (GPT-2 style), so the residual stream
        # stays in the range a trained model has instead of growing with every layer
        n_layer = cfg.fast.n_layer if name.startswith(FAST_PREFIX) else cfg.slow.n_layer
        std /= math.sqrt(2 * n_layer)
    return 0.0, std


def synth_tensor(name: str, shape: tuple[int, ...], cfg: FishConfig, seed: int) -> torch.Tensor:
    mean, std = _init_std(name, cfg)
    gen = torch.Generator().manual_seed(_tensor_seed(seed, name))
    out = torch.empty(shape, dtype=DTYPE)
    flat = out.view(-1)
    for start in range(0, flat.numel(), _CHUNK_ELEMENTS):
        n = min(_CHUNK_ELEMENTS, flat.numel() - start)
        draw = torch.randn(n, generator=gen).clamp_(-4.0, 4.0).mul_(std).add_(mean)
        flat[start:start + n] = draw
    return out


def plan_shards(spec: dict[str, tuple[int, ...]], shard_bytes: int) -> list[list[str]]:
    shards, current, size = [], [], 0
    for name, shape in spec.items():
        nbytes = math.prod(shape) * 2
        if current and size + nbytes > shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
    if current:
        shards.append(current)
    return shards


def _write_shard_streaming(path: Path, names: list[str], spec: dict, make) -> None:
    """Write a safetensors file one tensor at a time (the header is known from the spec)."""
    header, offset = {}, 0
    for name in names:
        nbytes = math.prod(spec[name]) * 2
        header[name] = {"dtype": SAFETENSORS_DTYPE, "shape": list(spec[name]), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format pads the header to 8-byte alignment
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(blob)))
        fh.write(blob)
        for name in names:
            bits = make(name, spec[name]).contiguous().view(torch.int16).numpy()
            if sys.byteorder != "little":  # the format stores little-endian
                bits = bits.byteswap()
            fh.write(bits.data)  # the tensor's own buffer: no second full-size copy
            del bits


def make_synthetic(out_dir: Path, preset_name: str, seed: int = 0) -> dict:
    """Write a deterministic synthetic checkpoint in the published layout; returns a report."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    p = _presets.preset(preset_name)
    cfg = FishConfig.from_dict(p.config, f"preset {preset_name}")
    spec = checkpoint_spec(cfg)
    shards = plan_shards(spec, p.shard_bytes)
    wmap, total = {}, 0
    for k, names in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        _write_shard_streaming(out_dir / fname, names, spec, lambda n, s: synth_tensor(n, s, cfg, seed))
        wmap.update({n: fname for n in names})
        total += sum(math.prod(spec[n]) * 2 for n in names)
        log.info("wrote %s (%d tensors)", fname, len(names))
    write_json(out_dir / INDEX_NAME, {"metadata": {"total_size": total}, "weight_map": wmap})
    from anetts.models.fish import codec

    codec_cfg = {"s2-pro": codec.s2_pro_config, "tiny": codec.tiny_config}[p.codec]()
    codec.check_config(codec_cfg, cfg.num_codebooks, cfg.codebook_size, f"preset {preset_name} codec")
    config = dict(p.config, **({codec.CODEC_CONFIG_KEY: codec_cfg} if p.codec != "s2-pro" else {}))
    (out_dir / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tok.write_tokenizer(out_dir / tok.TOKENIZER_NAME, p.text_vocab, cfg.codebook_size)
    codec_report = codec.write_synthetic_codec(out_dir, codec_cfg, seed)
    return {"preset": preset_name, "seed": seed, "tensors": len(spec), "shards": len(shards),
            "parameters": sum(math.prod(s) for s in spec.values()), "bytes": total, "codec": codec_report}


# ---------------------------------------------------------------------------------------
# Real sources (hf, local): anetts.weights fetches config + index, then this names the shards
# ---------------------------------------------------------------------------------------

def gather_shards(fetch, staging: Path) -> None:
    """Fetch the tokenizer and every shard the (already fetched) index names."""
    fetch([tok.TOKENIZER_NAME, *shard_files(staging)])


def load_state(weights_dir: Path, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Every tensor by checkpoint name (small models and tests; big ones use loader.py)."""
    from safetensors import safe_open

    state = {}
    for shard in shard_files(weights_dir):
        with safe_open(str(Path(weights_dir) / shard), framework="pt") as fh:
            for name in fh.keys():
                state[name] = fh.get_tensor(name).to(dtype)
    return state
