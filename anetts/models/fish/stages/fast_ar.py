"""`fast_ar`: the fast transformer, two functions over one fp16 KV state.

`frame` (the default, one call per frame): the 10 passes unrolled, each code drawn in the graph
(`CodeSampler`) and fed to the next pass, so a frame costs one call instead of ten. The draw is
upstream's: argmax at temperature 0, else top-p / top-k / temperature and the exponential race
on Gumbel noise the host supplies (`anetts.models.fish.sampling.frame_draw`): a seeded host stream
gives the same draws as the stepped path, and noise that favours chosen codes replays them
(`forced_draw`: how parity and the greedy checks follow upstream's codes).

`decode` (stepped, kept for comparison and for checks that pick per pass): call c of a frame
(pos = c, 0..num_codebooks-1) takes the final-normed slow state at c = 0 and
`fast_embeddings(code)` of the previous codebook's code after, writes KV row c of every fast
layer's fp16 state and returns the logits over the codebook.

The state is never reset between frames: pass c only attends to rows <= c, all written earlier
in the same frame, so the rows a previous frame left behind are masked (upstream zeroes its cache
per frame; the result is the same).
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
from anetts.models.fish.sampling import DECODE, FRAME, forced_draw
from anetts.models.fish.stages.layers import Block, CachedStack, rms_norm
from anetts.models.fish.weights import FAST_PREFIX, layer_tensors, read_config
from anetts.scenario import Call, Scenario
from anetts.stage import Stage
from anetts.tensors import FunctionSpec, StateSpec, TensorSpec


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


class CodeSampler(nn.Module):
    """One code from one pass's logits (1, codebook_size), as `sampling.sample_logits` draws it.

    Kept fp32 in an fp16 package (config `fp32_ops: [module:sampler]`): the top-p cumulative sum
    runs over thousands of probabilities of ~1e-4 each, below fp16's resolution near 0.7."""

    def forward(self, z, temperature, top_p, top_k, gumbel):
        n = z.shape[-1]
        s, order = torch.sort(z, dim=-1, descending=True)
        e = torch.exp(s - s[:, :1])
        cum = torch.cumsum(e / e.sum(-1, keepdim=True), dim=-1)
        rank = torch.arange(n, dtype=torch.int32).reshape(1, n)
        k = torch.where(top_k > 0, torch.clamp(top_k, max=n), torch.full_like(top_k, n))
        remove = torch.logical_and(torch.logical_or(cum > top_p, rank >= k), rank > 0)  # the best code always stays
        score = torch.where(remove, torch.full_like(s, float("-inf")), s / torch.clamp(temperature, min=1e-5))
        drawn = torch.gather(order, 1, torch.argmax(score + torch.gather(gumbel, 1, order), dim=-1, keepdim=True))
        greedy = torch.argmax(z, dim=-1, keepdim=True)
        return torch.where(temperature.reshape(1, 1) > 0, drawn, greedy).to(torch.int32).reshape(1)


class FastARModule(CachedStack):
    """forward(hidden, code, pos) is `decode`; forward(hidden, code, temperature, top_p, top_k,
    gumbel) is `frame` (the function's inputs in spec order, one module for both)."""

    def __init__(self, m: FastModel, lowering: str = "decomposed"):
        d, t = m.cfg.fast, m.tensors
        super().__init__(d, {i: Block(d, t, f"layers.{i}.", lowering) for i in range(d.n_layer)},
                         m.cfg.num_codebooks, m.cfg.num_codebooks)
        self.eps, self.lowering, self.codebooks = d.norm_eps, lowering, m.cfg.num_codebooks
        self.embeddings = nn.Parameter(t["embeddings.weight"].float(), requires_grad=False)
        self.norm_weight = nn.Parameter(t["norm.weight"].float(), requires_grad=False)
        self.output = nn.Parameter(t["output.weight"].float(), requires_grad=False)
        self.sampler = CodeSampler()

    def forward(self, *inputs):
        return self.decode(*inputs) if len(inputs) == 3 else self.frame(*inputs)

    def _pass(self, x, pos):
        x = self.run_blocks(x, pos)
        return F.linear(rms_norm(x, self.norm_weight, self.eps, self.lowering), self.output).reshape(1, -1)

    def _embed(self, code, like):
        return F.embedding(code, self.embeddings).reshape(like.shape)

    def decode(self, hidden, code, pos):
        return self._pass(torch.where(pos.reshape(1, 1, 1) == 0, hidden, self._embed(code, hidden)), pos)

    def frame(self, hidden, code, temperature, top_p, top_k, gumbel):
        logits, codes = [], []
        x, prev = hidden, code
        for c in range(self.codebooks):
            z = self._pass(x, torch.full((1,), c, dtype=torch.int32))
            logits.append(z)
            if c:  # pass 0 (the slow state) only fills the KV; code 0 is the semantic token's
                prev = self.sampler(z, temperature, top_p, top_k, gumbel[:, c - 1])
                codes.append(prev)
            x = self._embed(prev, hidden)
        return torch.stack(logits, 1), torch.stack(codes, 1)


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
        d, n, cb = self.cfg.fast, self.cfg.num_codebooks, self.cfg.codebook_size
        hidden = TensorSpec("hidden", (1, 1, d.dim), "float32", "final-normed slow state")
        frame = FunctionSpec(FRAME, (
            hidden,
            TensorSpec("code", (1,), "int32", "code 0: the frame's semantic token minus the first semantic id"),
            TensorSpec("temperature", (1,), "float32", "<= 0: every code the argmax"),
            TensorSpec("top_p", (1,), "float32", "nucleus of the temperature-1 softmax"),
            TensorSpec("top_k", (1,), "int32", "codes kept by rank (<= 0: all)"),
            TensorSpec("gumbel", (1, n - 1, cb), "float32", "-log(-log U) per code and entry (read at temperature > 0)")),
            (TensorSpec("frame_logits", (1, n, cb), "float32", "each pass's logits (pass 0's are not drawn from)"),
             TensorSpec("codes", (1, n - 1), "int32", "codes 1..num_codebooks-1")),
            self.states())
        decode = FunctionSpec(DECODE, (
            TensorSpec("hidden", (1, 1, d.dim), "float32", "final-normed slow state (read at pos 0 only)"),
            TensorSpec("code", (1,), "int32", "previous codebook's code (read at pos > 0 only)"),
            TensorSpec("pos", (1,), "int32", "codebook index 0..num_codebooks-1")),
            (TensorSpec("logits", (1, cb), "float32", "logits over the codebook"),),
            self.states())
        return [frame, decode]

    def geometry(self, size: int) -> dict[str, int]:
        return {"codebooks": self.cfg.num_codebooks, "codebook_size": self.cfg.codebook_size}

    def load(self, weights_dir: Path, size: int | None = None) -> FastModel:
        cfg = read_config(weights_dir)
        t = load_tensors(weights_dir, fast_tensor_names(cfg), dtype=torch.float32)
        return FastModel(cfg, {k[len(FAST_PREFIX):]: v for k, v in t.items()})

    def build(self, model: FastModel) -> nn.Module:
        return FastARModule(model, self.lowering).eval()

    def scenario(self, model: FastModel, weights_dir: Path, size: int, reference: dict):
        """Every frame of the reference run teacher-forced, once fused (`frame`, upstream's codes
        replayed by their noise) and once stepped (10 `decode` calls): upstream's logits of every
        pass expected, and its codes from `frame`."""
        sc = self.teacher_forced(reference["slow_hidden"], reference["codes"])
        n = self.cfg.num_codebooks
        fl, codes = np.asarray(reference["fast_logits"], np.float32), np.asarray(reference["codes"])
        expected = []
        for f in range(len(codes)):
            expected.append({"frame_logits": fl[f][None], "codes": codes[f, 1:].reshape(1, -1).astype(np.int32)})
            expected += [{"logits": fl[f, p].reshape(1, -1)} for p in range(n)]
        return sc, expected

    def logits_outputs(self) -> tuple[str, ...]:
        return ("frame_logits", "logits")

    def teacher_forced(self, slow_hidden: np.ndarray, codes: np.ndarray) -> Scenario:
        """Teacher-forced frames: frame f is one `frame` call on slow_hidden[f] and codes[f, 0], its
        codes forced to codes[f, 1:], then its 10 `decode` calls taking slow_hidden[f] then
        codes[f, 0..n-2]; one state carried through every frame."""
        n, cb = self.cfg.num_codebooks, self.cfg.codebook_size
        fns = {f.name: f for f in self.functions()}
        names = [s.name for s in self.states()]
        calls = []
        for h, c in zip(np.asarray(slow_hidden, np.float32), np.asarray(codes)):
            calls.append(Call(FRAME, {"hidden": h.reshape(1, 1, -1), "code": np.array([c[0]], np.int32),
                                      **forced_draw(c[1:], cb)}, state_valid={s: (2, n) for s in names}))
            for p in range(n):
                prev = 0 if p == 0 else int(c[p - 1])
                calls.append(Call(DECODE, {"hidden": h.reshape(1, 1, -1), "code": np.array([prev], np.int32),
                                           "pos": np.array([p], np.int32)}, state_valid={s: (2, p + 1) for s in names}))
        return Scenario(f"fast_ar_{len(calls) // (n + 1)}frames", fns, tuple(calls))
