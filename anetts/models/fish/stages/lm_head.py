"""The tied slow-AR head restricted to the rows the sampler can emit (held by the last slow chunk).

Upstream biases every logit outside the semantic ids and <|im_end|> to -inf before sampling,
so a head over those rows (semantic 0..n-1 in order, then <|im_end|>) gives the same argmax and
the same softmax over what can be drawn; the other rows (text tokens, 151,679 of S2's 155,776)
are never read per token. The rows are read from the shard with a slice, not the whole table.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from anetts.models.fish.config import FishConfig
from anetts.models.fish.weights import SLOW_PREFIX, WeightsError, read_index


def head_tensor_name(cfg: FishConfig) -> str:
    return f"{SLOW_PREFIX}{'embeddings' if cfg.slow.tie_word_embeddings else 'output'}.weight"


def restricted_ids(cfg: FishConfig) -> np.ndarray:
    """Token id of each restricted row (`FishConfig.restricted_ids`) as int64."""
    return np.asarray(cfg.restricted_ids, np.int64)


def load_rows(weights_dir: Path, name: str, ranges: list[tuple[int, int]]) -> torch.Tensor:
    """Rows [a, b) of each range of one checkpoint tensor, concatenated, read as slices of its shard."""
    from safetensors import safe_open

    weights_dir = Path(weights_dir)
    wmap = read_index(weights_dir)
    if name not in wmap:
        raise WeightsError(f"{weights_dir}: tensor {name} is not in the safetensors index")
    with safe_open(str(weights_dir / wmap[name]), framework="pt") as fh:
        sl = fh.get_slice(name)
        return torch.cat([sl[a:b] for a, b in ranges]).float()


def load_head(weights_dir: Path, cfg: FishConfig) -> torch.Tensor:
    """The restricted head (n_semantic + 1, dim), fp32: rows in `restricted_ids` order."""
    ranges = [(cfg.semantic_begin_id, cfg.semantic_end_id + 1), (cfg.im_end_id, cfg.im_end_id + 1)]
    return load_rows(weights_dir, head_tensor_name(cfg), ranges)
