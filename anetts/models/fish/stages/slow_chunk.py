"""`slow_chunk`: slow-AR layers [a, b) as one stateful package, `prefill` (P tokens) and
`decode` (1 token) sharing weights and one fp16 K and V state per layer.

Inputs: `hidden` (1, T, dim) residual stream entering layer a, `pos` (1,) int32 position of
its first token. Output: `hidden_out`, the residual stream after layer b-1; the last chunk
returns it final-normed (the fast AR's input) and `logits`, the restricted LM head over it
(`stages.lm_head`), so a frame's slow step and its head are one call. RoPE cos/sin come from a
bf16-rounded table inside the package, indexed by position; the causal mask is built from the
position. A chunk loads only its own tensors (`load_slow_layers`, and the head's rows).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from anetts.models.fish.config import FishConfig, chunk_bounds
from anetts.models.fish.loader import load_slow_layers
from anetts.models.fish.stages.layers import Block, CachedStack, rms_norm
from anetts.models.fish.stages.lm_head import load_head, restricted_ids
from anetts.models.fish.weights import read_config
from anetts.scenario import Call, Scenario
from anetts.stage import Stage
from anetts.tensors import FunctionSpec, StateSpec, TensorSpec


@dataclass
class ChunkModel:
    cfg: FishConfig
    start: int
    stop: int
    context: int
    tensors: dict[str, torch.Tensor]  # keyed layers.{i}.* (+ norm.weight and HEAD_WEIGHT for the last chunk)


# the last chunk's restricted head: its parameter, and so the weight's name in the package, which
# every compressed variant keeps fp16 (`SlowChunkStage.uncompressed_weights`)
HEAD_WEIGHT = "head_weight"


class SlowChunkModule(CachedStack):
    def __init__(self, m: ChunkModel, lowering: str = "decomposed", rope: str = "interleaved"):
        d = m.cfg.slow
        super().__init__(d, {i: Block(d, m.tensors, f"layers.{i}.", lowering, rope) for i in range(m.start, m.stop)},
                         m.context, m.context)
        self.final = m.stop == d.n_layer
        self.eps, self.lowering = d.norm_eps, lowering
        if self.final:
            self.norm_weight = nn.Parameter(m.tensors["norm.weight"].float(), requires_grad=False)
            self.head_weight = nn.Parameter(m.tensors[HEAD_WEIGHT].float(), requires_grad=False)

    def forward(self, hidden, pos):
        x = self.run_blocks(hidden, pos)
        if not self.final:
            return x
        x = rms_norm(x, self.norm_weight, self.eps, self.lowering)
        return x, F.linear(x, self.head_weight)


class SlowChunkStage(Stage):
    """Chunk `index` of `chunks` of the slow AR (stage `slow_chunk<index>`): the layers
    `chunk_bounds` gives it; `size` is the context (KV rows) of the package."""

    def __init__(self, cfg: FishConfig, index: int, chunks: int, prefill: int = 16, lowering: str = "decomposed",
                 rope: str = "interleaved"):
        self.name = chunk_stage_name(index)
        bounds = chunk_bounds(cfg.slow.n_layer, chunks)
        if not 0 <= index < len(bounds):
            raise ValueError(f"{self.name}: only {chunks} chunks are configured (slow_chunk0..{chunks - 1})")
        if prefill < 1:
            raise ValueError(f"{self.name}: prefill block {prefill} must be >= 1 token")
        self.cfg, self.prefill, self.lowering, self.rope = cfg, prefill, lowering, rope
        self.start, self.stop = bounds[index]
        self.final = self.stop == cfg.slow.n_layer
        self.description = f"slow-AR layers [{self.start}, {self.stop})" + (" + final norm + head" if self.final else "")

    def states(self, size: int) -> tuple[StateSpec, ...]:
        d = self.cfg.slow
        return tuple(StateSpec(f"{kind}_cache_{i}", (1, d.n_local_heads, size, d.head_dim), "float16",
                               f"layer {i} {kind.upper()} cache, row = position")
                     for i in range(self.start, self.stop) for kind in ("k", "v"))

    def _function(self, name: str, tokens: int, size: int) -> FunctionSpec:
        dim = self.cfg.slow.dim
        out = "final-normed slow state" if self.final else f"residual stream after layer {self.stop - 1}"
        outputs = (TensorSpec("hidden_out", (1, tokens, dim), "float32", out),)
        if self.final:
            outputs += (TensorSpec("logits", (1, tokens, len(self.cfg.restricted_ids)), "float32",
                                   "restricted head: logits of the semantic ids in order, then <|im_end|>"),)
        return FunctionSpec(name, (TensorSpec("hidden", (1, tokens, dim), "float32", f"residual stream before layer {self.start}"),
                                   TensorSpec("pos", (1,), "int32", "position of the first token")),
                            outputs, self.states(size))

    def functions(self, size: int) -> list[FunctionSpec]:
        if size < self.prefill:
            raise ValueError(f"{self.name}: context {size} is shorter than the prefill block {self.prefill}")
        return [self._function("prefill", self.prefill, size), self._function("decode", 1, size)]

    def geometry(self, size: int) -> dict[str, int]:
        return {"layer_start": self.start, "layer_stop": self.stop, "context": size, "prefill": self.prefill,
                "final_norm": int(self.final), "head_rows": len(self.cfg.restricted_ids) if self.final else 0}

    def logits_outputs(self) -> tuple[str, ...]:
        return ("logits",) if self.final else ()

    def uncompressed_weights(self) -> tuple[str, ...]:
        """The head stays fp16 in every variant, as in every public S2 port."""
        return (HEAD_WEIGHT,) if self.final else ()

    def load(self, weights_dir: Path, size: int) -> ChunkModel:
        cfg = read_config(weights_dir)
        tensors = load_slow_layers(weights_dir, self.start, self.stop, dtype=torch.float32)
        if self.final:
            tensors[HEAD_WEIGHT] = load_head(weights_dir, cfg)
        return ChunkModel(cfg, self.start, self.stop, size, tensors)

    def build(self, model: ChunkModel) -> nn.Module:
        """One module serves both functions (the token count is the input's length)."""
        return SlowChunkModule(model, self.lowering, self.rope).eval()

    def scenario(self, model: ChunkModel, weights_dir: Path, size: int, reference: dict):
        """The prompt and decode steps of the shared reference run: the residual stream entering
        layer `start` in, the one leaving layer `stop - 1` expected (for the last chunk final-normed,
        and upstream's logits at the head's rows), at every position."""
        a, b = self.start, self.stop
        T = reference["prompt"].shape[1]
        before = np.concatenate([reference["prefill_layer_hidden"][a], reference["decode_layer_hidden"][:, a]])
        if self.final:  # frame 0's slow step is the prefill's last position
            after = {"hidden_out": np.concatenate([reference["prefill_slow_hidden"], reference["slow_hidden"][1:]]),
                     "logits": np.concatenate([reference["prefill_head_logits"],
                                               reference["slow_logits"][1:, restricted_ids(self.cfg)]])}
        else:
            after = {"hidden_out": np.concatenate([reference["prefill_layer_hidden"][b],
                                                   reference["decode_layer_hidden"][:, b]])}
        sc = self.teacher_forced(before, T, size)
        expected = []
        for c in sc.calls:
            p = int(c.inputs["pos"][0])
            n = c.inputs["hidden"].shape[1]
            k = min(n, T - p) if c.function == "prefill" else 1
            want = {}
            for name, rows in after.items():
                want[name] = np.zeros((1, n, rows.shape[1]), np.float32)
                want[name][0, :k] = rows[p:p + k]
            expected.append(want)
        return sc, expected

    def teacher_forced(self, hidden: np.ndarray, prompt_len: int, size: int) -> Scenario:
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
                              valid={t.name: (1, k) for t in fns["prefill"].outputs},
                              state_valid={s: (2, p + k) for s in names}))
        for p in range(prompt_len, n):
            calls.append(Call("decode", {"hidden": hidden[None, p:p + 1], "pos": np.array([p], np.int32)},
                              state_valid={s: (2, p + 1) for s in names}))
        return Scenario(f"{self.name}_prefill{prompt_len}_decode{n - prompt_len}", fns, tuple(calls))


def chunk_stage_name(index: int) -> str:
    """The one name of chunk `index`: its stage in config, the DAG, packages and the runtime."""
    return f"slow_chunk{index}"

