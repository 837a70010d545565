"""S2's sampler in numpy: top-p, top-k, temperature, an exponential-race draw, and RAS.

`sample_logits` is upstream's draw (fish-speech S2 / mlx-audio `_sample_logits`): sort the logits,
drop what lies past top-p of the temperature-1 softmax or past rank top-k (the best one always
stays), softmax of the rest / temperature, then `argmax(p / E)` with E = -log U, U ~ U[1e-6, 1),
which draws from p. Temperature <= 0 is the argmax. The semantic draw adds RAS: if the drawn
token is a semantic id among the last `ras_window` semantic tokens, the token of a parallel draw at
temperature 1.0 / top-p 0.9 (same top-k) is used instead. Both draws take their noise every step,
so the random stream does not depend on the outcome. Greedy decoding (temperature 0) disables RAS:
it is upstream's greedy reference decode.

The fast AR's fused `frame` function draws its codes in the graph the same way, on noise the host
supplies (`frame_draw`): Gumbel noise G = -log(-log U), since argmax(p / E) = argmax(log p + G)
for E = -log U. The same seeded U stream therefore gives the same codes as the stepped path, and
noise that favours chosen codes replays them (`forced_draw`).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

RAS_WINDOW = 10
RAS_TEMPERATURE = 1.0
RAS_TOP_P = 0.9
NOISE_LOW = 1e-6
# The fast AR package's functions: `frame` (the 10 passes, codes drawn in the graph) and `decode`
# (one pass per call, drawn here)
FRAME, DECODE = "frame", "decode"
# Gumbel noise that makes a code win the race whatever the logits (they are O(10)); a forced code
# must also survive top-p / top-k, which `forced_draw` turns off
FORCE_GUMBEL = 1e4


@dataclass(frozen=True)
class SamplingParams:
    """Semantic and codebook sampling (S2 CLI defaults: 1.0 / 0.9 / 30; mlx-audio: 0.7 / 0.7 / 30)."""

    temperature: float = 0.7
    top_p: float = 0.7
    top_k: int = 30
    ras_window: int = RAS_WINDOW

    def __post_init__(self):
        for name, v, ok in (("temperature", self.temperature, lambda x: 0 <= x < 10),
                            ("top_p", self.top_p, lambda x: 0 < x <= 1),
                            ("top_k", self.top_k, lambda x: x >= 0),
                            ("ras_window", self.ras_window, lambda x: x >= 0)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or not ok(v):
                raise ValueError(f"sampling parameter {name}={v!r} is out of range "
                                 "(temperature in [0, 10), top_p in (0, 1], top_k >= 0, ras_window >= 0)")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def filtered_probs(logits: np.ndarray, temperature: float, top_p: float, top_k: int) -> np.ndarray:
    """The distribution the draw samples from (float64, sums to 1)."""
    z = np.asarray(logits, np.float64).reshape(-1)
    n = z.size
    k = n if top_k <= 0 or top_k > n else int(top_k)
    order = np.argsort(-z, kind="stable")
    s = z[order]
    finite = np.isfinite(s)
    e = np.where(finite, np.exp(s - s[0]), 0.0)
    cum = np.cumsum(e / e.sum())
    remove = (cum > top_p) | (np.arange(n) >= k)
    remove[0] = False
    keep = np.zeros(n, bool)
    keep[order] = ~remove
    w = np.where(keep & np.isfinite(z), z / max(temperature, 1e-5), -np.inf)
    p = np.exp(w - w.max())
    return p / p.sum()


def sample_logits(logits: np.ndarray, temperature: float, top_p: float, top_k: int,
                  rng: np.random.Generator | None) -> int:
    """One draw (an index into `logits`); argmax at temperature <= 0 (no noise drawn)."""
    z = np.asarray(logits).reshape(-1)
    if temperature <= 0:
        return int(np.argmax(z))
    p = filtered_probs(z, temperature, top_p, top_k)
    noise = -np.log(rng.uniform(NOISE_LOW, 1.0, size=z.size))
    return int(np.argmax(p / noise))


class SemanticSampler:
    """Draws the semantic token (an index into the restricted head's rows) with RAS over the window."""

    def __init__(self, params: SamplingParams, row_ids: np.ndarray, semantic_range: tuple[int, int],
                 rng: np.random.Generator):
        self.params, self.row_ids, self.rng = params, np.asarray(row_ids), rng
        self.lo, self.hi = semantic_range
        self.recent: deque[int] = deque(maxlen=max(params.ras_window, 1))
        self.ras_used = 0

    def __call__(self, logits: np.ndarray) -> int:
        """Token id of this frame; remembers semantic ids for RAS."""
        p = self.params
        if p.greedy:
            token = int(self.row_ids[int(np.argmax(np.asarray(logits).reshape(-1)))])
        else:
            normal = int(self.row_ids[sample_logits(logits, p.temperature, p.top_p, p.top_k, self.rng)])
            high = int(self.row_ids[sample_logits(logits, RAS_TEMPERATURE, RAS_TOP_P, p.top_k, self.rng)])
            token = normal
            if p.ras_window and self.lo <= normal <= self.hi and normal in self.recent:
                token = high
                self.ras_used += 1
        if self.lo <= token <= self.hi and p.ras_window:
            self.recent.append(token)
        return token


def gumbel_noise(uniform: np.ndarray) -> np.ndarray:
    """The `frame` function's noise from the uniform draws U that `sample_logits` would take."""
    return (-np.log(-np.log(np.asarray(uniform, np.float64)))).astype(np.float32)


def frame_draw(temperature: float, top_p: float, top_k: int, gumbel: np.ndarray) -> dict[str, np.ndarray]:
    """The sampling inputs of the `frame` function: gumbel (1, num_codebooks - 1, codebook_size)."""
    return {"temperature": np.array([temperature], np.float32), "top_p": np.array([top_p], np.float32),
            "top_k": np.array([top_k], np.int32), "gumbel": np.asarray(gumbel, np.float32)}


def forced_draw(codes, codebook_size: int) -> dict[str, np.ndarray]:
    """`frame_draw` under which the frame function draws `codes` (its codes 1..n-1) whatever its logits."""
    g = np.zeros((1, len(codes), codebook_size), np.float32)
    g[0, np.arange(len(codes)), np.asarray(codes, np.int64)] = FORCE_GUMBEL
    return frame_draw(1.0, 1.0, 0, g)
