"""Compose the compiled Fish AR stages on the MIL executor into a greedy decode (packages made
by the build, or by `anetts.compile.scenario_export.compile_module`). `mil_decode` runs the compiled slow
chunks -> lm_head -> fast_ar closed loop, the host doing what upstream's decode step does
around the networks: the 11-row input embedding, the greedy picks and codebook 0 from the
semantic token. `compare_decode` scores it against the upstream reference decode.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from anetts.models.fish.config import FishConfig
from anetts.models.fish.loader import load_tensors
from anetts.models.fish.weights import FAST_PREFIX, SLOW_PREFIX
from anetts.verify.metrics import compare, top1_agreement
from anetts.verify.scenario import Scenario


def package_bytes(package: Path) -> int:
    return sum(p.stat().st_size for p in Path(package).rglob("*") if p.is_file())


def play_mil(package: Path, scenario: Scenario) -> list[dict[str, np.ndarray]]:
    """Every call's outputs on the MIL executor, one state carried through (run_scenario scores;
    this keeps the outputs, e.g. for top-1 agreement of logits)."""
    from anetts.mil import load_program

    program = load_program(package)
    state = program.make_state(scenario.calls[0].function) if scenario.states else None
    return [program.run(dict(c.inputs), function_name=c.function, state=state) for c in scenario.calls]


class HostEmbedding:
    """The slow AR's 11-row input embedding (upstream `forward_generate`'s first half), in numpy."""

    def __init__(self, weights_dir: Path, cfg: FishConfig):
        t = load_tensors(weights_dir, [f"{SLOW_PREFIX}embeddings.weight", f"{FAST_PREFIX}codebook_embeddings.weight"],
                         dtype=torch.float32)
        self.cfg = cfg
        self.text, self.codebooks = (v.numpy() for v in t.values())

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        """rows (1 + num_codebooks, T) ids -> (T, dim)."""
        cfg = self.cfg
        rows = np.asarray(rows, np.int64)
        x = self.text[rows[0]].copy()
        offsets = (np.arange(cfg.num_codebooks) * cfg.codebook_size)[:, None]
        vq = self.codebooks[rows[1:] + offsets].sum(axis=0)
        semantic = (rows[0] >= cfg.semantic_begin_id) & (rows[0] <= cfg.semantic_end_id)
        x[semantic] = (x[semantic] + vq[semantic]) / np.float32(cfg.semantic_scale)
        return x


class SlowChunks:
    """The compiled slow chunks in order, each with its state: one call runs the residual stream
    through all of them (chunk k's output is chunk k+1's input), as a runtime composes them."""

    def __init__(self, chunks: Sequence[Path], prefill: int):
        from anetts.mil import load_program

        self.programs = [load_program(p) for p in chunks]
        self.states = [p.make_state("decode") for p in self.programs]
        self.prefill_tokens = prefill
        self.seconds = 0.0

    def __call__(self, x: np.ndarray, pos: int, function: str) -> np.ndarray:
        t0 = time.perf_counter()
        for prog, st in zip(self.programs, self.states):
            x = prog.run({"hidden": x, "pos": np.array([pos], np.int32)}, function_name=function, state=st)["hidden_out"]
        self.seconds += time.perf_counter() - t0
        return x

    def prefill(self, x: np.ndarray) -> np.ndarray:
        """Prompt rows (T, dim) in prefill blocks (the last one zero-padded); the last row's output."""
        T, P = x.shape[0], self.prefill_tokens
        for p in range(0, T, P):
            k = min(P, T - p)
            block = np.zeros((1, P, x.shape[1]), np.float32)
            block[0, :k] = x[p:p + k]
            h = self(block, p, "prefill")[0, k - 1]
        return h


def mil_decode(cfg: FishConfig, embed: HostEmbedding, chunks: Sequence[Path], head: Path, fast: Path,
               prompt: np.ndarray, n_frames: int, prefill: int) -> dict:
    """Greedy decode of `n_frames` frames with every network on the MIL executor."""
    from anetts.mil import load_program

    from anetts.models.fish.stages.lm_head import restricted_ids

    slow = SlowChunks(chunks, prefill)
    head_p, fast_p = load_program(head), load_program(fast)
    fast_state = fast_p.make_state("decode")
    ids = restricted_ids(cfg)
    T = prompt.shape[1]
    seconds = {"slow": 0.0, "head": 0.0, "fast": 0.0}

    h = slow.prefill(embed(prompt))
    out = {k: [] for k in ("slow_hidden", "head_logits", "semantic_tokens", "codes", "fast_logits", "positions")}
    for f in range(n_frames):
        t0 = time.perf_counter()
        logits = head_p.run({"hidden": h.reshape(1, 1, -1).astype(np.float32)}, function_name="logits")["logits"].reshape(-1)
        seconds["head"] += time.perf_counter() - t0
        token = int(ids[int(np.argmax(logits))])
        codes = [min(max(token - cfg.semantic_begin_id, 0), cfg.codebook_size - 1)]
        fast_logits = []
        t0 = time.perf_counter()
        for c in range(cfg.num_codebooks):
            fl = fast_p.run({"hidden": h.reshape(1, 1, -1).astype(np.float32),
                             "code": np.array([0 if c == 0 else codes[-1]], np.int32), "pos": np.array([c], np.int32)},
                            function_name="decode", state=fast_state)["logits"].reshape(-1)
            fast_logits.append(fl)
            if c > 0:
                codes.append(int(np.argmax(fl)))
        seconds["fast"] += time.perf_counter() - t0
        out["slow_hidden"].append(h)
        out["head_logits"].append(logits)
        out["semantic_tokens"].append(token)
        out["codes"].append(codes)
        out["fast_logits"].append(np.stack(fast_logits))
        out["positions"].append(T - 1 + f)
        if f + 1 < n_frames:
            x = embed(np.array([token, *codes]).reshape(-1, 1))
            h = slow(x[None], T + f, "decode")[0, 0]
    res = {k: np.asarray(v) for k, v in out.items()}
    seconds["slow"] = slow.seconds
    res["seconds"] = {k: round(v, 3) for k, v in seconds.items()}
    return res


def compare_decode(cfg: FishConfig, got: dict, ref: dict) -> dict:
    """Per frame: exact codes, semantic token, slow-state dB; top-1 agreement of the restricted head."""
    from anetts.models.fish.stages.lm_head import restricted_ids

    n = len(got["codes"])
    ids = restricted_ids(cfg)
    codes_equal = got["codes"] == ref["codes"][:n]
    return {
        "frames": n,
        "positions": [int(p) for p in got["positions"]],
        "frames_all_codes_equal": int(codes_equal.all(axis=1).sum()),
        "codes_equal": int(codes_equal.sum()), "codes_total": int(codes_equal.size),
        "semantic_equal": int((got["semantic_tokens"] == ref["semantic_tokens"][:n]).sum()),
        "slow_hidden_db": [compare(ref["slow_hidden"][i], got["slow_hidden"][i])["snr_db"] for i in range(n)],
        "head_top1": top1_agreement(ref["slow_logits"][:n][:, ids], got["head_logits"]),
        "fast_top1": top1_agreement(ref["fast_logits"][:n, 1:], got["fast_logits"][:, 1:]),
        "seconds": got["seconds"],
    }
