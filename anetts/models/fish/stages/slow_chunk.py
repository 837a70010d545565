"""`slow_chunk`: slow-AR layers [a, b) as one stateful package, `prefill` (P tokens) and
`decode` (1 token) sharing weights and one fp16 K and V state per layer.

Inputs: `hidden` (1, T, dim) residual stream entering layer a, `pos` (1,) int32 position of
its first token. Output: `hidden_out`, the residual stream after layer b-1; the last chunk
returns it final-normed (the fast AR's input and the LM head's). RoPE cos/sin come from a
bf16-rounded table inside the package, indexed by position; the causal mask is built from the
position. A chunk loads only its own tensors (`load_slow_layers`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from anetts.models.fish.config import FishConfig
from anetts.models.fish.loader import load_slow_layers
from anetts.models.fish.stages.layers import Block, CachedStack, rms_norm
from anetts.models.fish.weights import read_config
from anetts.stage import FunctionSpec, StateSpec, TensorSpec
from anetts.verify.scenario import Call, Scenario


@dataclass
class ChunkModel:
    cfg: FishConfig
    start: int
    stop: int
    context: int
    tensors: dict[str, torch.Tensor]  # keyed layers.{i}.* (+ norm.weight for the last chunk)


class SlowChunkModule(CachedStack):
    def __init__(self, m: ChunkModel, lowering: str = "decomposed", rope: str = "interleaved"):
        d = m.cfg.slow
        super().__init__(d, {i: Block(d, m.tensors, f"layers.{i}.", lowering, rope) for i in range(m.start, m.stop)},
                         m.context, m.context)
        self.final = m.stop == d.n_layer
        self.eps, self.lowering = d.norm_eps, lowering
        if self.final:
            self.norm_weight = nn.Parameter(m.tensors["norm.weight"].float(), requires_grad=False)

    def forward(self, hidden, pos):
        x = self.run_blocks(hidden, pos)
        return rms_norm(x, self.norm_weight, self.eps, self.lowering) if self.final else x


class SlowChunkStage:
    """Layers [start, stop) of the slow AR; `size` is the context (KV rows) of the package."""

    def __init__(self, cfg: FishConfig, start: int, stop: int, prefill: int = 16, lowering: str = "decomposed",
                 rope: str = "interleaved"):
        if not 0 <= start < stop <= cfg.slow.n_layer:
            raise ValueError(f"slow_chunk: layer range [{start}, {stop}) is outside 0..{cfg.slow.n_layer}")
        if prefill < 1:
            raise ValueError(f"slow_chunk: prefill block {prefill} must be >= 1 token")
        self.cfg, self.start, self.stop, self.prefill, self.lowering = cfg, start, stop, prefill, lowering
        self.rope = rope
        self.name = f"slow_chunk_{start}_{stop}"
        self.final = stop == cfg.slow.n_layer

    def states(self, size: int) -> tuple[StateSpec, ...]:
        d = self.cfg.slow
        return tuple(StateSpec(f"{kind}_cache_{i}", (1, d.n_local_heads, size, d.head_dim), "float16",
                               f"layer {i} {kind.upper()} cache, row = position")
                     for i in range(self.start, self.stop) for kind in ("k", "v"))

    def _function(self, name: str, tokens: int, size: int) -> FunctionSpec:
        dim = self.cfg.slow.dim
        out = "final-normed slow state" if self.final else f"residual stream after layer {self.stop - 1}"
        return FunctionSpec(name, (TensorSpec("hidden", (1, tokens, dim), "float32", f"residual stream before layer {self.start}"),
                                   TensorSpec("pos", (1,), "int32", "position of the first token")),
                            (TensorSpec("hidden_out", (1, tokens, dim), "float32", out),), self.states(size))

    def functions(self, size: int) -> list[FunctionSpec]:
        if size < self.prefill:
            raise ValueError(f"{self.name}: context {size} is shorter than the prefill block {self.prefill}")
        return [self._function("prefill", self.prefill, size), self._function("decode", 1, size)]

    def load_model(self, weights_dir: Path, size: int) -> ChunkModel:
        cfg = read_config(weights_dir)
        return ChunkModel(cfg, self.start, self.stop, size,
                          load_slow_layers(weights_dir, self.start, self.stop, dtype=torch.float32))

    def build_function(self, model: ChunkModel, name: str) -> nn.Module:
        """One module serves both functions (the token count is the input's length)."""
        if name not in ("prefill", "decode"):
            raise KeyError(f"{self.name}: no function {name!r}; functions: ['prefill', 'decode']")
        return SlowChunkModule(model, self.lowering, self.rope).eval()

    def scenario(self, hidden: np.ndarray, prompt_len: int, size: int) -> Scenario:
        """Teacher-forced calls: the prompt (positions 0..prompt_len-1) in prefill blocks, the last
        one padded with zeros, then one decode call per remaining row of `hidden` (N, dim)."""
        hidden = np.asarray(hidden, np.float32)
        n = hidden.shape[0]
        if n > size:
            raise ValueError(f"{self.name}: {n} positions do not fit a context of {size}")
        if -(-prompt_len // self.prefill) * self.prefill > size:
            raise ValueError(f"{self.name}: the padded prefill of {prompt_len} tokens exceeds the context {size}")
        fns = {f.name: f for f in self.functions(size)}
        names = [s.name for s in self.states(size)]
        calls = []
        for p in range(0, prompt_len, self.prefill):
            k = min(self.prefill, prompt_len - p)
            block = np.zeros((1, self.prefill, hidden.shape[1]), np.float32)
            block[0, :k] = hidden[p:p + k]
            calls.append(Call("prefill", {"hidden": block, "pos": np.array([p], np.int32)},
                              valid={"hidden_out": (1, k)}, state_valid={s: (2, p + k) for s in names}))
        for p in range(prompt_len, n):
            calls.append(Call("decode", {"hidden": hidden[None, p:p + 1], "pos": np.array([p], np.int32)},
                              state_valid={s: (2, p + 1) for s in names}))
        return Scenario(f"{self.name}_prefill{prompt_len}_decode{n - prompt_len}", fns, tuple(calls))


def chunk_bounds(n_layer: int, n_chunks: int) -> list[tuple[int, int]]:
    """Contiguous [a, b) ranges, the first ones one layer longer when n_layer % n_chunks != 0."""
    if not 1 <= n_chunks <= n_layer:
        raise ValueError(f"{n_chunks} chunks for {n_layer} layers")
    q, r = divmod(n_layer, n_chunks)
    out, a = [], 0
    for k in range(n_chunks):
        b = a + q + (k < r)
        out.append((a, b))
        a = b
    return out
