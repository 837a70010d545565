"""The compiled Fish AR chain against upstream: the runtime's decode loop over the packages.

Per-stage parity feeds each package upstream's own inputs; here the runtime's loop
(`runtime.FishDecoder`: the host input embedding from the fp16 assets, the slow chunks carrying
their states, the LM head and the fast AR on the compiled slow state) feeds each package the
previous one's output, so errors compound as they will at run time. It runs twice, greedily
(`greedy.Greedy`):

- teacher-forced: where the compiled pick differs from upstream's, upstream's is fed on, so every
  frame is compared on upstream's path; gated per frame on the slow state's SNR (`min_snr_db`),
  and over all frames on top-1 agreement of the head and of the fast AR's codes (`min_top1`);
- closed loop: the compiled picks fed back, reported (frames whose codes all equal upstream's,
  the first divergence and upstream's logit gap there), not gated: after one flipped near-tie the
  two decodes are different, equally valid sequences.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from anetts.models.fish.assets import InputEmbedding
from anetts.models.fish.greedy import Greedy
from anetts.models.fish.runtime import FishDecoder
from anetts.options import Gate
from anetts.provenance import provenance


def mil_program(stage: str, package: Path):
    """A built package on the MIL executor, its typed functions from its convert report (beside it)."""
    from anetts.compile.manifest import report_functions
    from anetts.runtime.runners import PackageRef, load_program
    from anetts.stage import FunctionSpec

    report = json.loads(Path(package).with_suffix(".json").read_text(encoding="utf-8"))
    functions = tuple(FunctionSpec.from_json(f) for f in report_functions(report))
    return load_program("mil", PackageRef(f"{stage} ({Path(package).name})", Path(package), functions,
                                          report.get("default_function", functions[0].name)))


def compiled_decoder(chunks: dict[str, Path], head: Path, fast: Path, embed: InputEmbedding,
                     prefill: int) -> FishDecoder:
    """The runtime's decode loop on the MIL executor over these packages: `chunks` the slow AR's, in
    layer order ({stage: package}), then the head and the fast AR."""
    if not chunks:
        raise ValueError("chain: no slow chunk packages")
    programs = {s: mil_program(s, p) for s, p in {**chunks, "lm_head": head, "fast_ar": fast}.items()}
    kv = programs[next(iter(chunks))].function("decode").states[0].shape  # (1, kv_heads, context, head_dim)
    return FishDecoder(embed.cfg, embed, programs.__getitem__, list(chunks), kv[2], prefill, embed.cfg.restricted_ids)


def decode_against(decoder: FishDecoder, ref: dict, n_frames: int, follow: bool) -> dict:
    """The decoder's greedy decode of upstream's prompt for `n_frames` frames, summarized against upstream."""
    picks = Greedy(decoder.cfg, decoder.row_ids, ref, follow=follow)
    t0 = time.perf_counter()
    for _ in decoder.generate(ref["prompt"], n_frames, picks, stop_at_end=False):
        pass
    out = picks.summary()
    out["seconds"] = {k: round(v, 3) for k, v in {**picks.timings, "total": time.perf_counter() - t0}.items()}
    return out


def check_chain(packages: dict[str, Path], chunks: list[str], assets_dir: Path, reference: Path, gate: Gate,
                prefill: int, closed_loop_frames: int | None = None) -> dict:
    """`chunks`: the slow chunk stages among `packages`, in layer order."""
    for name in (*chunks, "lm_head", "fast_ar"):
        if name not in packages:
            raise ValueError(f"chain: no {name} package among {sorted(packages)}")
    with np.load(reference) as z:
        ref = {k: z[k] for k in z.files}
    embed = InputEmbedding.from_dir(assets_dir)
    decoder = compiled_decoder({c: packages[c] for c in chunks}, packages["lm_head"], packages["fast_ar"], embed, prefill)
    n = len(ref["codes"])
    stops = np.flatnonzero(ref["semantic_tokens"] == embed.cfg.im_end_id)
    if len(stops):  # upstream's reference ran on past <|im_end|>; the runtime's loop stops there
        n = int(stops[0])
    tf = decode_against(decoder, ref, n, follow=True)
    loop = decode_against(decoder, ref, min(closed_loop_frames or n, n), follow=False)
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
        "seconds": {"teacher_forced": tf["seconds"]["total"], "closed_loop": loop["seconds"]["total"]},
        "provenance": provenance(),
    }
