"""`lm_head`: the tied slow-AR head restricted to the rows the sampler can emit.

Upstream biases every logit outside the semantic ids and <|im_end|> to -inf before sampling,
so a head over those rows (semantic 0..n-1 in order, then <|im_end|>) gives the same argmax and
the same softmax over what can be drawn; the other rows (text tokens, 151,679 of S2's 155,776)
are never read per token. The rows are read from the shard with a slice, not the whole table.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from anetts.models.fish.config import FishConfig
from anetts.models.fish.weights import SLOW_PREFIX, WeightsError, read_config, read_index
from anetts.stage import FunctionSpec, TensorSpec
from anetts.verify.scenario import Call, Scenario

FP16_BYTES = 2


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


@dataclass
class HeadModel:
    cfg: FishConfig
    weight: torch.Tensor  # (n_semantic + 1, dim): rows in restricted_ids order


class LMHeadModule(nn.Module):
    def __init__(self, m: HeadModel):
        super().__init__()
        self.weight = nn.Parameter(m.weight.float(), requires_grad=False)

    def forward(self, hidden):
        return F.linear(hidden, self.weight)


class LMHeadStage:
    name = "lm_head"

    def __init__(self, cfg: FishConfig):
        self.cfg = cfg
        self.rows = len(restricted_ids(cfg))

    def functions(self, size: int = 1) -> list[FunctionSpec]:
        d = self.cfg.slow.dim
        return [FunctionSpec("logits", (TensorSpec("hidden", (1, size, d), "float32", "final-normed slow state"),),
                             (TensorSpec("logits", (1, size, self.rows), "float32",
                                         "logits of the semantic ids in order, then <|im_end|>"),))]

    def load_model(self, weights_dir: Path, size: int = 1) -> HeadModel:
        cfg = read_config(weights_dir)
        ranges = [(cfg.semantic_begin_id, cfg.semantic_end_id + 1), (cfg.im_end_id, cfg.im_end_id + 1)]
        return HeadModel(cfg, load_rows(weights_dir, head_tensor_name(cfg), ranges))

    def build_function(self, model: HeadModel, name: str = "logits") -> nn.Module:
        if name != "logits":
            raise KeyError(f"lm_head: no function {name!r}; functions: ['logits']")
        return LMHeadModule(model).eval()

    def scenario(self, hidden: np.ndarray) -> Scenario:
        """One call per row of `hidden` (N, dim): each a frame's final-normed slow state."""
        fns = {f.name: f for f in self.functions(1)}
        calls = tuple(Call("logits", {"hidden": np.asarray(h, np.float32).reshape(1, 1, -1)}) for h in hidden)
        return Scenario(f"lm_head_{len(calls)}", fns, calls)

    def bytes_per_token(self) -> dict:
        """fp16 weight bytes the head reads per generated token: restricted vs the full head."""
        s = self.cfg.slow
        return {"restricted_rows": self.rows, "full_rows": s.vocab_size,
                "restricted_bytes": self.rows * s.dim * FP16_BYTES, "full_bytes": s.vocab_size * s.dim * FP16_BYTES}

    def token(self, logits: np.ndarray) -> int:
        """The greedy token id from restricted logits (the last axis)."""
        return int(restricted_ids(self.cfg)[int(np.argmax(np.asarray(logits).reshape(-1)))])
