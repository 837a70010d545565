"""Per-layer loading from the safetensors shards: a slow-AR chunk reads only its own tensors.

The index tells which shard holds each tensor; `safe_open` memory-maps a shard and copies out
only the tensors asked for, so loading layers [a, b) of a 9 GB checkpoint costs the bytes of
those layers, never the whole model.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch

from anetts.models.fish.config import FishConfig
from anetts.models.fish.weights import (
    SLOW_PREFIX, WeightsError, layer_tensors, read_config, read_index, slow_layer_prefix,
)


def load_tensors(weights_dir: Path, names: list[str], dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The named checkpoint tensors, each read from the shard the index assigns it."""
    from safetensors import safe_open

    weights_dir = Path(weights_dir)
    wmap = read_index(weights_dir)
    by_shard: dict[str, list[str]] = defaultdict(list)
    for name in names:
        if name not in wmap:
            raise WeightsError(f"{weights_dir}: tensor {name} is not in the safetensors index")
        by_shard[wmap[name]].append(name)
    out = {}
    for shard, shard_names in sorted(by_shard.items()):
        with safe_open(str(weights_dir / shard), framework="pt") as fh:
            for name in shard_names:
                t = fh.get_tensor(name)
                out[name] = t if dtype is None else t.to(dtype)
    return {name: out[name] for name in names}


def slow_layer_names(cfg: FishConfig, start: int, stop: int) -> list[str]:
    if not 0 <= start < stop <= cfg.slow.n_layer:
        raise ValueError(f"slow layer range [{start}, {stop}) is outside 0..{cfg.slow.n_layer}")
    names = []
    for i in range(start, stop):
        names += list(layer_tensors(cfg.slow, slow_layer_prefix(i)))
    return names


def load_slow_layers(weights_dir: Path, start: int, stop: int, dtype: torch.dtype | None = None,
                     final_norm: bool | None = None) -> dict[str, torch.Tensor]:
    """Tensors of slow layers [start, stop), keyed `layers.{i}.<name>` as in fish-speech's module.

    `final_norm` (default: when the range ends at the last layer) adds `norm.weight`, which the
    last chunk applies.
    """
    cfg = read_config(weights_dir)
    names = slow_layer_names(cfg, start, stop)
    if final_norm is None:
        final_norm = stop == cfg.slow.n_layer
    if final_norm:
        names.append(f"{SLOW_PREFIX}norm.weight")
    return {name[len(SLOW_PREFIX):]: t for name, t in load_tensors(weights_dir, names, dtype).items()}
