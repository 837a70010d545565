"""The compiled Fish AR chain against upstream: the packages composed as the runtime composes them.

Per-stage parity feeds each package upstream's own inputs; here each package takes the previous
package's output, so errors compound as they will at run time:

- teacher-forced: the prompt and then upstream's own tokens and codes go in (through the host
  input embedding from the fp16 assets), the compiled slow chunks carry their states, the LM head
  and the fast AR run on the compiled slow state; gated per frame on the slow state's SNR
  (`min_snr_db`), and over all frames on top-1 agreement of the head and of the fast AR's codes
  with upstream (`min_top1`);
- closed loop: a greedy decode with every network compiled (`stages.chain.mil_decode`), reported
  (frames whose codes all equal upstream's, the first that differs), not gated: after one flipped
  near-tie the two decodes are different, equally valid sequences.
"""
from __future__ import annotations

import re
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from anetts.models.fish.assets import InputEmbedding
from anetts.options import Gate
from anetts.provenance import provenance
from anetts.verify.metrics import compare, top1_agreement


def _chunks(packages: dict[str, Path]) -> list[Path]:
    idx = sorted((int(m.group(1)), p) for s, p in packages.items() if (m := re.fullmatch(r"slow_chunk(\d+)", s)))
    if not idx or [i for i, _ in idx] != list(range(len(idx))):
        raise ValueError(f"chain: slow_chunk packages must be slow_chunk0..N-1, got {sorted(packages)}")
    return [p for _, p in idx]


def teacher_forced(embed, chunks, head, fast, ref: dict, prefill: int) -> dict:
    from anetts.mil import load_program
    from anetts.models.fish.stages.chain import SlowChunks
    from anetts.models.fish.stages.lm_head import restricted_ids

    cfg = embed.cfg
    slow = SlowChunks(chunks, prefill)
    head_p, fast_p = load_program(head), load_program(fast)
    fast_state = fast_p.make_state("decode")
    prompt = ref["prompt"]
    T, F = prompt.shape[1], len(ref["codes"])
    h = slow.prefill(embed(prompt))
    ids = restricted_ids(cfg)
    hidden, head_logits, fast_codes = [], [], []
    for f in range(F):
        if f > 0:
            rows = np.array([ref["semantic_tokens"][f - 1], *ref["codes"][f - 1]]).reshape(-1, 1)
            h = slow(embed(rows)[None], T + f - 1, "decode")[0, 0]
        hidden.append(h)
        head_logits.append(head_p.run({"hidden": h.reshape(1, 1, -1).astype(np.float32)}, function_name="logits")["logits"].reshape(-1))
        codes = []
        for c in range(1, cfg.num_codebooks + 1):
            prev = 0 if c == 1 else int(ref["codes"][f][c - 2])
            fl = fast_p.run({"hidden": h.reshape(1, 1, -1).astype(np.float32), "code": np.array([prev], np.int32),
                             "pos": np.array([c - 1], np.int32)}, function_name="decode", state=fast_state)["logits"]
            if c > 1:
                codes.append(int(np.argmax(fl)))
        fast_codes.append(codes)
    hidden, head_logits, fast_codes = np.asarray(hidden), np.asarray(head_logits), np.asarray(fast_codes)
    hidden_db = [compare(ref["slow_hidden"][f], hidden[f])["snr_db"] for f in range(F)]
    want_codes = ref["codes"][:, 1:]
    return {
        "frames": F, "positions": [T - 1, T + F - 2],
        "slow_hidden_db": [round(float(d), 2) for d in hidden_db],
        "slow_hidden_min_db": float(min(hidden_db)),
        "head_top1": top1_agreement(ref["slow_logits"][:, ids], head_logits),
        "head_mismatch_frames": [int(i) for i in np.flatnonzero(ids[head_logits.argmax(-1)] != ref["semantic_tokens"])],
        "fast_codes_agreement": float(np.mean(fast_codes == want_codes)),
        "fast_frames_all_codes_equal": int((fast_codes == want_codes).all(axis=1).sum()),
    }


def check_chain(packages: dict[str, Path], assets_dir: Path, reference: Path, gate: Gate, prefill: int,
                closed_loop_frames: int | None = None) -> dict:
    from anetts.models.fish.stages.chain import compare_decode, mil_decode

    with np.load(reference) as z:
        ref = {k: z[k] for k in z.files}
    embed = InputEmbedding.from_dir(assets_dir)
    chunks = _chunks(packages)
    for name in ("lm_head", "fast_ar"):
        if name not in packages:
            raise ValueError(f"chain: no {name} package among {sorted(packages)}")
    t0 = time.perf_counter()
    tf = teacher_forced(embed, chunks, packages["lm_head"], packages["fast_ar"], ref, prefill)
    t1 = time.perf_counter()
    n = closed_loop_frames or len(ref["codes"])
    got = mil_decode(embed.cfg, embed, chunks, packages["lm_head"], packages["fast_ar"], ref["prompt"], n, prefill)
    loop = compare_decode(embed.cfg, got, ref)
    equal = (got["codes"] == ref["codes"][:n]).all(axis=1) & (got["semantic_tokens"] == ref["semantic_tokens"][:n])
    loop["first_divergent_frame"] = int(np.argmin(equal)) if not equal.all() else None
    loop["slow_hidden_db"] = [round(float(d), 2) for d in loop["slow_hidden_db"]]
    t2 = time.perf_counter()
    checks = {
        "slow_hidden_min_db": tf["slow_hidden_min_db"] >= gate.min_snr_db,
        "head_top1": tf["head_top1"] >= gate.min_top1,
        "fast_codes_agreement": tf["fast_codes_agreement"] >= gate.min_top1,
    }
    return {
        "kind": "chain",
        "packages": {k: str(v) for k, v in sorted(packages.items())},
        "gate": asdict(gate),
        "teacher_forced": tf,
        "closed_loop": loop,
        "checks": checks,
        "passed": all(checks.values()),
        "meets_target": all(checks.values()) and tf["slow_hidden_min_db"] >= gate.target_snr_db,
        "seconds": {"teacher_forced": round(t1 - t0, 3), "closed_loop": round(t2 - t1, 3)},
        "provenance": provenance(),
    }
