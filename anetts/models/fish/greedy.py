"""Greedy decoding in the runtime's loop, against an upstream greedy decode.

`Greedy` is the decode loop's `Picks` (anetts.models.fish.runtime) for the chain check and the
end-to-end gate: every pick is the argmax of the compiled logits, and it records per frame what
the loop saw (slow position, final-normed slow state, head and fast-AR logits) and what it picked.

Where a pick differs from upstream's it records the divergence: frame, codebook (0: the semantic
token, which sets code 0), upstream's logit gap between its own pick and the runtime's, and that
gap in units of the step's logit noise (`metrics.gap_in_noise`). On random weights the logits are
flat, near-ties are common and fp16 flips them; the gap in noise units says whether a divergence is
such a tie, at any depth of fp16 error (the noise grows with the layers). With `follow` (teacher forcing) it then goes on with
upstream's pick, so every later pick is still compared on upstream's path; without it the loop
runs closed and only the first divergence is comparable (after it, the two decodes are different
sequences).
"""
from __future__ import annotations

import numpy as np

from anetts.models.fish.config import FishConfig
from anetts.models.fish.runtime import Picks
from anetts.models.fish.sampling import forced_draw, frame_draw
from anetts.metrics import compare, gap_in_noise, top1_agreement


class Greedy(Picks):
    """`upstream`: reference_decode's arrays (semantic_tokens (F,), codes (F, 10), slow_logits (F, vocab),
    fast_logits (F, 10, codebook_size), slow_hidden (F, dim))."""

    def __init__(self, cfg: FishConfig, row_ids: np.ndarray, upstream: dict, follow: bool):
        super().__init__()
        self.cfg, self.row_ids, self.up, self.follow = cfg, np.asarray(row_ids), upstream, follow
        self.row_of = {int(t): i for i, t in enumerate(self.row_ids)}
        self.tokens: list[int] = []  # the runtime's own picks
        self.codes: list[list[int]] = []
        self.positions: list[int] = []
        self.hidden: list[np.ndarray] = []
        self.head_logits: list[np.ndarray] = []
        self.fast_logits: list[list[np.ndarray]] = []
        self.divergences: list[dict] = []

    def _diverged(self, frame: int, codebook: int, own: int, up: int, up_logits: np.ndarray, logits: np.ndarray,
                  own_index: int, up_index: int) -> None:
        """`up_logits`, `logits`: upstream's and the runtime's logits of this pick, index for index."""
        if self.follow or not self.divergences:  # closed loop: later picks are on another path
            up_gap = float(up_logits[up_index] - up_logits[own_index])
            self.divergences.append({"frame": frame, "codebook": codebook, "runtime": own, "upstream": up,
                                     "upstream_gap": up_gap, "runtime_gap": float(logits[own_index] - logits[up_index]),
                                     **gap_in_noise(up_gap, up_logits, logits)})

    def _upstream_token(self, frame: int) -> int:
        if frame >= len(self.up["semantic_tokens"]):
            raise ValueError(f"the decode ran past upstream's {len(self.up['semantic_tokens'])} frames")
        return int(self.up["semantic_tokens"][frame])

    def semantic(self, frame: int, logits: np.ndarray) -> int:
        own = int(self.row_ids[int(np.argmax(logits))])
        up = self._upstream_token(frame)
        self.tokens.append(own)
        self.codes.append([min(max(own - self.cfg.semantic_begin_id, 0), self.cfg.codebook_size - 1)])
        if own != up:  # the head's logits are over the restricted rows
            ul = self.up["slow_logits"][frame][self.row_ids]
            self._diverged(frame, 0, own, up, ul, logits, self.row_of[own], self.row_of[up])
        return up if self.follow else own

    def code(self, frame: int, codebook: int, logits: np.ndarray) -> int:
        own = int(np.argmax(logits))
        self.codes[frame].append(own)
        up = int(self.up["codes"][frame][codebook]) if frame < len(self.up["codes"]) else own
        if own != up:
            self._diverged(frame, codebook, own, up, self.up["fast_logits"][frame][codebook], logits, own, up)
        return up if self.follow else own

    def draw(self, frame: int) -> dict[str, np.ndarray]:
        """Fused fast AR: upstream's codes replayed by their noise when following, else the argmax."""
        n, cb = self.cfg.num_codebooks, self.cfg.codebook_size
        if self.follow and frame < len(self.up["codes"]):
            return forced_draw(np.asarray(self.up["codes"][frame])[1:], cb)
        return frame_draw(0.0, 1.0, 0, np.zeros((1, n - 1, cb), np.float32))

    def drawn(self, frame: int, codes: list[int], logits: np.ndarray) -> list[int]:
        """Each pass's argmax compared with upstream as the stepped picks are; the graph must have
        drawn what this picks (upstream's codes when following, the argmax when not)."""
        keep = [self.code(frame, c, logits[c]) for c in range(1, self.cfg.num_codebooks)]
        if keep != list(codes):
            want = "upstream's, forced by their noise" if self.follow else "the argmax of its logits"
            raise ValueError(f"frame {frame}: the fused fast AR drew codes {list(codes)}, expected {keep} ({want})")
        return keep

    def seen(self, frame, position, hidden, head_logits, fast_logits) -> None:
        self.positions.append(int(position))
        self.hidden.append(np.asarray(hidden, np.float32).reshape(-1))
        self.head_logits.append(np.asarray(head_logits).reshape(-1))
        self.fast_logits.append(list(fast_logits))

    # -------------------------------------------------------------- against upstream

    def summary(self) -> dict:
        """Per frame against upstream: equal picks, the slow state's SNR, the head's and the fast AR's
        logits' SNR (worst pick); top-1 agreement of the head and of the fast AR; the divergences (each
        with upstream's logit gap, the step's logit noise and the gap in units of it)."""
        n = len(self.tokens)
        up_tokens, up_codes = self.up["semantic_tokens"][:n], self.up["codes"][:n]
        own_codes = np.array([c + [0] * (self.cfg.num_codebooks - len(c)) for c in self.codes], np.int64)
        codes_equal = own_codes.reshape(n, -1) == up_codes
        semantic_equal = np.asarray(self.tokens) == up_tokens
        frames_equal = codes_equal.all(axis=1) & semantic_equal
        ids = self.row_ids
        full = [f for f in range(n) if len(self.fast_logits[f]) == self.cfg.num_codebooks]
        hidden_db = [round(float(compare(self.up["slow_hidden"][f], self.hidden[f])["snr_db"]), 2) for f in range(n)]
        head_db = [compare(self.up["slow_logits"][f][ids], self.head_logits[f])["snr_db"] for f in range(n)]
        fast_db = [compare(self.up["fast_logits"][f][c], self.fast_logits[f][c])["snr_db"]
                   for f in full for c in range(1, self.cfg.num_codebooks)]
        return {
            "frames": n,
            "positions": self.positions,
            "frames_all_codes_equal": int(frames_equal.sum()),
            "semantic_equal": int(semantic_equal.sum()),
            "head_mismatch_frames": [int(f) for f in np.flatnonzero(~semantic_equal)],
            "fast_codes_agreement": float(codes_equal[:, 1:].mean()) if n else None,
            "fast_frames_all_codes_equal": int(codes_equal[:, 1:].all(axis=1).sum()),
            "codes_equal": int(codes_equal.sum()), "codes_total": int(codes_equal.size),
            "first_divergent_frame": None if frames_equal.all() else int(np.argmin(frames_equal)),
            "first_divergence": self.divergences[0] if self.divergences else None,
            "divergences": self.divergences,
            "slow_hidden_db": hidden_db,
            "slow_hidden_min_db": min(hidden_db) if hidden_db else None,
            # every pick's logits against upstream's on the same path (the noise its near-ties are judged by)
            "head_logits_min_db": round(min(head_db), 2) if head_db else None,
            "fast_logits_min_db": round(min(fast_db), 2) if fast_db else None,
            "head_top1": top1_agreement(self.up["slow_logits"][:n][:, ids], np.stack(self.head_logits)),
            "fast_top1": top1_agreement(np.concatenate([self.up["fast_logits"][f][1:] for f in full]),
                                        np.concatenate([np.stack(self.fast_logits[f][1:]) for f in full])) if full else None,
        }
