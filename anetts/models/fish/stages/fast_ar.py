"""`fast_ar`: the fast transformer as one stateful `decode` function, called once per codebook.

Call c of a frame (pos = c, 0..num_codebooks-1) takes the final-normed slow state at c = 0 and
`fast_embeddings(code)` of the previous codebook's code after, writes KV row c of every fast
layer's fp16 state and returns the logits over the codebook. The state is never reset between
frames: call c only attends to rows <= c, all written earlier in the same frame, so the rows a
previous frame left behind are masked (upstream zeroes its cache per frame; the result is the same).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from anetts.models.fish.config import FishConfig
from anetts.models.fish.loader import load_tensors
from anetts.models.fish.stages.layers import Block, CachedStack, rms_norm
from anetts.models.fish.weights import FAST_PREFIX, layer_tensors, read_config
from anetts.stage import FunctionSpec, Stage, StateSpec, TensorSpec
from anetts.verify.scenario import Call, Scenario


def fast_tensor_names(cfg: FishConfig) -> list[str]:
    """Every fast-AR tensor of the checkpoint except the slow input's codebook_embeddings."""
    names = [f"{FAST_PREFIX}embeddings.weight"]
    for i in range(cfg.fast.n_layer):
        names += list(layer_tensors(cfg.fast, f"{FAST_PREFIX}layers.{i}."))
    return names + [f"{FAST_PREFIX}norm.weight", f"{FAST_PREFIX}output.weight"]


@dataclass
class FastModel:
    cfg: FishConfig
    tensors: dict[str, torch.Tensor]  # keyed without the audio_decoder. prefix


class FastARModule(CachedStack):
    def __init__(self, m: FastModel, lowering: str = "decomposed"):
        d, t = m.cfg.fast, m.tensors
        super().__init__(d, {i: Block(d, t, f"layers.{i}.", lowering) for i in range(d.n_layer)},
                         m.cfg.num_codebooks, m.cfg.num_codebooks)
        self.eps, self.lowering = d.norm_eps, lowering
        self.embeddings = nn.Parameter(t["embeddings.weight"].float(), requires_grad=False)
        self.norm_weight = nn.Parameter(t["norm.weight"].float(), requires_grad=False)
        self.output = nn.Parameter(t["output.weight"].float(), requires_grad=False)

    def forward(self, hidden, code, pos):
        x = torch.where(pos.reshape(1, 1, 1) == 0, hidden, F.embedding(code, self.embeddings).reshape(hidden.shape))
        x = self.run_blocks(x, pos)
        return F.linear(rms_norm(x, self.norm_weight, self.eps, self.lowering), self.output).reshape(1, -1)


class FastARStage(Stage):
    name = "fast_ar"
    description = "fast AR"

    def __init__(self, cfg: FishConfig, lowering: str = "decomposed"):
        self.cfg, self.lowering = cfg, lowering

    def states(self) -> tuple[StateSpec, ...]:
        d = self.cfg.fast
        return tuple(StateSpec(f"{kind}_cache_{i}", (1, d.n_local_heads, self.cfg.num_codebooks, d.head_dim), "float16",
                               f"fast layer {i} {kind.upper()} cache, row = codebook")
                     for i in range(d.n_layer) for kind in ("k", "v"))

    def functions(self, size: int | None = None) -> list[FunctionSpec]:
        d = self.cfg.fast
        return [FunctionSpec("decode", (
            TensorSpec("hidden", (1, 1, d.dim), "float32", "final-normed slow state (read at pos 0 only)"),
            TensorSpec("code", (1,), "int32", "previous codebook's code (read at pos > 0 only)"),
            TensorSpec("pos", (1,), "int32", "codebook index 0..num_codebooks-1")),
            (TensorSpec("logits", (1, self.cfg.codebook_size), "float32", "logits over the codebook"),),
            self.states())]

    def geometry(self, size: int) -> dict[str, int]:
        return {"codebooks": self.cfg.num_codebooks, "codebook_size": self.cfg.codebook_size}

    def load(self, weights_dir: Path, size: int | None = None) -> FastModel:
        cfg = read_config(weights_dir)
        t = load_tensors(weights_dir, fast_tensor_names(cfg), dtype=torch.float32)
        return FastModel(cfg, {k[len(FAST_PREFIX):]: v for k, v in t.items()})

    def build(self, model: FastModel) -> nn.Module:
        return FastARModule(model, self.lowering).eval()

    def scenario(self, model: FastModel, size: int, reference: dict):
        """Every frame of the reference run teacher-forced: upstream's logits per codebook expected."""
        sc = self.teacher_forced(reference["slow_hidden"], reference["codes"])
        n = self.cfg.num_codebooks
        fl = reference["fast_logits"]
        return sc, [{"logits": fl[i // n, i % n].reshape(1, -1).astype(np.float32)} for i in range(len(sc.calls))]

    def logits_outputs(self) -> tuple[str, ...]:
        return ("logits",)

    def teacher_forced(self, slow_hidden: np.ndarray, codes: np.ndarray) -> Scenario:
        """Teacher-forced frames: frame f's calls take slow_hidden[f] then codes[f, 0..n-2]; one state
        carried through every frame."""
        n = self.cfg.num_codebooks
        fns = {f.name: f for f in self.functions()}
        names = [s.name for s in self.states()]
        calls = []
        for h, c in zip(np.asarray(slow_hidden, np.float32), np.asarray(codes)):
            for p in range(n):
                prev = 0 if p == 0 else int(c[p - 1])
                calls.append(Call("decode", {"hidden": h.reshape(1, 1, -1), "code": np.array([prev], np.int32),
                                             "pos": np.array([p], np.int32)}, state_valid={s: (2, p + 1) for s in names}))
        return Scenario(f"fast_ar_{len(calls) // n}frames", fns, tuple(calls))
