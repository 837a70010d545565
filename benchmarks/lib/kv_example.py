"""The smallest stateful stage: causal self-attention over a KV cache, with its function specs
(`prefill`, `decode`) and a prefill-then-decode scenario.  The worked example of docs/states.md,
used by tests/compile/test_stateful_stage.py and benchmarks/stateful_scenario.py.

The caches are `register_buffer`s written in place with slice assignment at `pos` (an int32
input, so tracing keeps the write position dynamic); keys past the current position are masked,
so the cache's unwritten rows never matter.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from anetts.scenario import Call, Scenario
from anetts.tensors import FunctionSpec, StateSpec, TensorSpec


@dataclass(frozen=True)
class KVGeometry:
    dim: int = 32
    heads: int = 2
    context: int = 16  # cache rows: the longest sequence the state holds

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


class KVAttention(nn.Module):
    def __init__(self, g: KVGeometry):
        super().__init__()
        if g.dim % g.heads:
            raise ValueError(f"dim {g.dim} is not a multiple of heads {g.heads}")
        self.g = g
        self.qkv = nn.Linear(g.dim, 3 * g.dim)
        self.out = nn.Linear(g.dim, g.dim)
        self.register_buffer("k_cache", torch.zeros(1, g.heads, g.context, g.head_dim))
        self.register_buffer("v_cache", torch.zeros(1, g.heads, g.context, g.head_dim))

    def forward(self, x, pos):
        g = self.g
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, g.heads, g.head_dim).transpose(1, 2) for z in (q, k, v))
        p = pos[0]
        self.k_cache[:, :, p:p + t] = k
        self.v_cache[:, :, p:p + t] = v
        att = (q @ self.k_cache.transpose(-1, -2)) * g.head_dim ** -0.5
        keys = torch.arange(g.context, dtype=torch.int32)
        mask = keys[None, :] <= (pos + torch.arange(t, dtype=torch.int32))[:, None]
        att = torch.where(mask, att, torch.full_like(att, -1e4))
        y = att.softmax(-1) @ self.v_cache
        return self.out(y.transpose(1, 2).reshape(b, t, d))


def states(g: KVGeometry) -> tuple[StateSpec, ...]:
    return tuple(StateSpec(n, (1, g.heads, g.context, g.head_dim), "float16", f"{n[0].upper()} cache, by position")
                 for n in ("k_cache", "v_cache"))


def function_spec(g: KVGeometry, name: str, tokens: int) -> FunctionSpec:
    return FunctionSpec(name, (TensorSpec("x", (1, tokens, g.dim), "float32", "token features"),
                               TensorSpec("pos", (1,), "int32", "position of the first token")),
                        (TensorSpec("y", (1, tokens, g.dim), "float32", "attention output"),), states(g))


def functions(g: KVGeometry, prefill: int) -> dict[str, FunctionSpec]:
    return {"prefill": function_spec(g, "prefill", prefill), "decode": function_spec(g, "decode", 1)}


def prefill_decode(g: KVGeometry, prefill: int, steps: int, seed: int = 7) -> Scenario:
    """Prefill `prefill` tokens at position 0, then `steps` single-token decode calls."""
    if prefill + steps > g.context:
        raise ValueError(f"{prefill} + {steps} tokens do not fit a {g.context}-row cache")
    x = np.random.default_rng(seed).standard_normal((1, prefill + steps, g.dim)).astype(np.float32)
    names = [s.name for s in states(g)]
    calls = [Call("prefill", {"x": x[:, :prefill], "pos": np.array([0], np.int32)},
                  state_valid={n: (2, prefill) for n in names})]
    for p in range(prefill, prefill + steps):
        calls.append(Call("decode", {"x": x[:, p:p + 1], "pos": np.array([p], np.int32)},
                          state_valid={n: (2, p + 1) for n in names}))
    return Scenario(f"prefill{prefill}_decode{steps}", functions(g, prefill), tuple(calls))
