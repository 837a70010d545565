"""The compiled Fish AR chain against upstream: the runtime's decode loop over the packages.

Per-stage parity feeds each package upstream's own inputs; here the runtime's loop
(`runtime.FishDecoder`: the host input embedding from the fp16 assets, the slow chunks carrying
their states, the last one's LM head, and the fast AR on the compiled slow state) feeds each package the
previous one's output, so errors compound as they will at run time. It runs twice, greedily
(`greedy.Greedy`):

- teacher-forced: where the compiled pick differs from upstream's, upstream's is fed on, so every
  frame is compared on upstream's path; gated per frame on the slow state's SNR (`min_snr_db`),
  and over all frames on the head's and the fast AR's picks (`min_top1`): the fraction equal to
  upstream's or near-ties — a flip whose upstream gap is at most `NEAR_TIE_NOISE` units of its
  step's logit noise (`metrics.gap_in_noise`) at a step whose logits are within `min_snr_db` of
  upstream's. fp16 noise grows with depth, and at S2 Pro's 36 layers it flips a few percent of
  flat random-weight picks (docs/fish.md); a wrong loop's logits are far off, so none of its flips
  counts as a tie. The raw top-1 agreements are reported beside;
- closed loop: the compiled picks fed back, reported (frames whose codes all equal upstream's,
  the first divergence and upstream's logit gap there), not gated: after one flipped near-tie the
  two decodes are different, equally valid sequences.

Then the fast AR's two functions against each other (`fused_vs_stepped`): the loop with the
stepped `decode` (codes drawn on the host) and again with the fused `frame` (codes drawn in the
graph on the same seeded noise), greedy and sampled, over `fused_frames` frames (default
`FUSED_FRAMES`; a model's `chain: {fused_frames}` in the config). The fused run follows the stepped
run's picks, so every frame is compared; gated: each code that differs must be a near-tie of the
stepped run — its logit gap (greedy) or its race gap log p + G (sampled) at most `FUSED_DRAW_GAP`
(the draw's arithmetic: fp32 in the graph, fp64 on the host) plus `NEAR_TIE_NOISE` units of that
pass's logit noise between the two graphs (`metrics.gap_in_noise`; over the temperature when
sampled), which grows with the model's depth where the two graphs' logits differ.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from anetts.models.fish.assets import InputEmbedding
from anetts.models.fish.greedy import Greedy
from anetts.models.fish.runtime import FishDecoder, Sampling
from anetts.models.fish.sampling import DECODE, FRAME, SamplingParams, filtered_probs
from anetts.metrics import compare, gap_in_noise
from anetts.options import Gate
from anetts.provenance import provenance
from anetts.scenario import Scenario

FUSED_FRAMES = 128
# A flip within this many units of its step's logit noise is a near-tie (the end-to-end gate's
# `max_tie_noise` in config.yaml is the same judgement). fish-tiny's fp16 flips: <= 1.66 units;
# fish-s2-pro's: <= 2.58 (end_to_end, docs/fish.md).
NEAR_TIE_NOISE = 4.0
# The fused graph draws in fp32, the host in fp64: picks closer than this floor (plus the near-tie
# noise above, when the two graphs' logits differ) may differ. fish-tiny: identical logits on the
# MIL executor; one sampled flip in 128 frames, race gap 0.0013.
FUSED_DRAW_GAP = 0.01
FUSED_SAMPLING = {"greedy": SamplingParams(temperature=0.0), "sampled": SamplingParams()}


def mil_program(stage: str, package: Path):
    """A built package on the MIL executor, its typed functions from its convert report (beside it)."""
    from anetts.compile.manifest import report_functions
    from anetts.runtime.runners import PackageRef, load_program
    from anetts.tensors import FunctionSpec

    report = json.loads(Path(package).with_suffix(".json").read_text(encoding="utf-8"))
    functions = tuple(FunctionSpec.from_json(f) for f in report_functions(report))
    return load_program("mil", PackageRef(f"{stage} ({Path(package).name})", Path(package), functions,
                                          report.get("default_function", functions[0].name)))


def play_mil(package: Path, scenario: Scenario) -> list[dict[str, np.ndarray]]:
    """Every call's outputs on the MIL executor's runner, one state carried through, for tests and
    benchmarks of a compiled AR stage (a package of the build, or one `anetts.compile.export.compile_module`
    made); parity's `run_scenario` scores, this keeps the outputs (e.g. for top-1 agreement of logits)."""
    program = mil_program(Path(package).stem, package)
    state = program.new_state(scenario.calls[0].function) if scenario.states else None
    return [program.run(c.function, dict(c.inputs), state) for c in scenario.calls]


def compiled_decoder(chunks: dict[str, Path], fast: Path, embed: InputEmbedding, prefill: int) -> FishDecoder:
    """The runtime's decode loop on the MIL executor over these packages: `chunks` the slow AR's, in
    layer order ({stage: package}; the last holds the head), then the fast AR."""
    if not chunks:
        raise ValueError("chain: no slow chunk packages")
    programs = {s: mil_program(s, p) for s, p in {**chunks, "fast_ar": fast}.items()}
    kv = programs[next(iter(chunks))].function("decode").states[0].shape  # (1, kv_heads, context, head_dim)
    return FishDecoder(embed.cfg, embed, programs.__getitem__, list(chunks), kv[2], prefill, embed.cfg.restricted_ids)


def decode_against(decoder: FishDecoder, ref: dict, n_frames: int, follow: bool) -> dict:
    """The decoder's greedy decode of upstream's prompt for `n_frames` frames, summarized against upstream."""
    picks = Greedy(decoder.cfg, decoder.row_ids, ref, follow=follow)
    t0 = time.perf_counter()
    for _ in decoder.generate(ref["prompt"], n_frames, picks, stop_at_end=False):
        pass
    out = picks.summary()
    ids = decoder.row_ids
    for d in out["divergences"]:  # the SNR of the step's logits: a near-tie needs them close to upstream's
        f, c = d["frame"], d["codebook"]
        up, got = (ref["slow_logits"][f][ids], picks.head_logits[f]) if c == 0 else (ref["fast_logits"][f][c], picks.fast_logits[f][c])
        d["logits_db"] = compare(up, got)["snr_db"]
    out["seconds"] = {k: round(v, 3) for k, v in {**picks.timings, "total": time.perf_counter() - t0}.items()}
    return out


class _Recorded(Sampling):
    """The stepped run's picks, with every pass's logits kept."""

    def __init__(self, *args):
        super().__init__(*args)
        self.fast_logits: list[np.ndarray] = []

    def seen(self, frame, position, hidden, head_logits, fast_logits) -> None:
        self.fast_logits.append(np.asarray(fast_logits, np.float32))


class _Replay(Sampling):
    """The fused run on the same seeded stream, following the stepped run's tokens and codes."""

    def __init__(self, params, cfg, row_ids, seed, stepped: list[tuple[int, list[int]]], stepped_logits):
        super().__init__(params, cfg, row_ids, seed)
        self.stepped, self.stepped_logits = stepped, stepped_logits
        self.tokens_equal, self.frames_equal, self.logits_db, self.divergences = 0, 0, [], []

    def semantic(self, frame: int, logits: np.ndarray) -> int:
        own = super().semantic(frame, logits)  # draws as the stepped run did
        self.tokens_equal += own == self.stepped[frame][0]
        return self.stepped[frame][0]

    def draw(self, frame: int) -> dict[str, np.ndarray]:
        self._draw = super().draw(frame)
        return self._draw

    def drawn(self, frame: int, codes: list[int], logits: np.ndarray) -> list[int]:
        want, ref = self.stepped[frame][1][1:], self.stepped_logits[frame]
        if codes == want:
            self.frames_equal += 1
            self.logits_db.append(float(compare(ref, logits)["snr_db"]))
            return want
        c = next(i for i, (a, b) in enumerate(zip(codes, want)) if a != b)  # later codes follow another path
        z, p = ref[c + 1].astype(np.float64), self.params
        if p.greedy:
            score = z
        else:
            with np.errstate(divide="ignore"):
                score = np.log(filtered_probs(z, p.temperature, p.top_p, p.top_k)) + self._draw["gumbel"][0, c]
        gap = float(score[want[c]] - score[codes[c]])
        noise = gap_in_noise(gap, ref[c + 1], logits[c + 1])["logit_noise"]
        noise = noise if p.greedy else noise / p.temperature  # log p differences are logit differences / T
        self.divergences.append({"frame": frame, "codebook": c + 1, "stepped": want[c], "fused": codes[c],
                                 "stepped_gap": gap, "noise": noise,
                                 "tie_bound": FUSED_DRAW_GAP + NEAR_TIE_NOISE * noise})
        return want


def picks_or_ties(run: dict, cfg, min_logits_db: float) -> dict:
    """Of a teacher-forced run's head and fast-AR picks, the fraction equal to upstream's or near-ties
    (module doc)."""
    def tie(d):
        return d["gap_in_noise"] is not None and d["gap_in_noise"] <= NEAR_TIE_NOISE and d["logits_db"] >= min_logits_db

    far = [d for d in run["divergences"] if not tie(d)]
    n, head_far = run["frames"], sum(d["codebook"] == 0 for d in far)
    return {"head": 1 - head_far / n if n else None,
            "fast": 1 - (len(far) - head_far) / (n * (cfg.num_codebooks - 1)) if n else None,
            "ties": len(run["divergences"]) - len(far), "not_ties": len(far)}


def fused_vs_stepped(decoder: FishDecoder, rows: np.ndarray, n_frames: int, seed: int = 0) -> dict:
    """The fast AR's `frame` against its `decode` in the decode loop, greedy and sampled (module doc)."""
    out = {}
    for mode, params in FUSED_SAMPLING.items():
        stepped = _Recorded(params, decoder.cfg, decoder.row_ids, seed)
        decoder.fast_function = DECODE
        t0 = time.perf_counter()
        frames = list(decoder.generate(rows, n_frames, stepped, stop_at_end=False))
        t1 = time.perf_counter()
        fused = _Replay(params, decoder.cfg, decoder.row_ids, seed, frames, stepped.fast_logits)
        decoder.fast_function = FRAME
        try:
            n = sum(1 for _ in decoder.generate(rows, n_frames, fused, stop_at_end=False))
        finally:
            decoder.fast_function = None
        gaps = [d["stepped_gap"] for d in fused.divergences]
        out[mode] = {"params": asdict(params), "seed": seed, "frames": n, "semantic_equal": fused.tokens_equal,
                     "frames_all_codes_equal": fused.frames_equal, "divergences": fused.divergences,
                     "max_stepped_gap": max(gaps, default=None),
                     "frame_logits_min_db": round(min(fused.logits_db), 2) if fused.logits_db else None,
                     "fast_seconds": {"stepped": round(stepped.timings["fast"], 3), "fused": round(fused.timings["fast"], 3)},
                     "seconds": {"stepped": round(t1 - t0, 3), "fused": round(time.perf_counter() - t1, 3)}}
        out[mode]["passed"] = bool(n == len(frames) and fused.tokens_equal == n
                                   and all(d["stepped_gap"] <= d["tie_bound"] for d in fused.divergences))
    return out


def check_chain(packages: dict[str, Path], chunks: list[str], assets_dir: Path, reference: Path, gate: Gate,
                prefill: int, closed_loop_frames: int | None = None, fused_frames: int = FUSED_FRAMES) -> dict:
    """`chunks`: the slow chunk stages among `packages`, in layer order."""
    for name in (*chunks, "fast_ar"):
        if name not in packages:
            raise ValueError(f"chain: no {name} package among {sorted(packages)}")
    with np.load(reference) as z:
        ref = {k: z[k] for k in z.files}
    embed = InputEmbedding.from_dir(assets_dir)
    decoder = compiled_decoder({c: packages[c] for c in chunks}, packages["fast_ar"], embed, prefill)
    n = len(ref["codes"])
    stops = np.flatnonzero(ref["semantic_tokens"] == embed.cfg.im_end_id)
    if len(stops):  # upstream's reference ran on past <|im_end|>; the runtime's loop stops there
        n = int(stops[0])
    tf = decode_against(decoder, ref, n, follow=True)
    tf["picks_or_ties"] = picks_or_ties(tf, embed.cfg, gate.min_snr_db)
    loop = decode_against(decoder, ref, min(closed_loop_frames or n, n), follow=False)
    # a prompt of one prefill block leaves the context's room for the fused-vs-stepped frames
    rows = ref["prompt"][:, :prefill]
    fused = fused_vs_stepped(decoder, rows, min(fused_frames, decoder.room(rows.shape[1])))
    checks = {
        "slow_hidden_min_db": tf["slow_hidden_min_db"] >= gate.min_snr_db,
        "head_picks": tf["picks_or_ties"]["head"] >= gate.min_top1,
        "fast_picks": tf["picks_or_ties"]["fast"] >= gate.min_top1,
        **{f"fused_equals_stepped_{mode}": r["passed"] for mode, r in fused.items()},
    }
    return {
        "kind": "chain",
        "packages": {k: str(v) for k, v in sorted(packages.items())},
        "gate": asdict(gate),
        "teacher_forced": tf,
        "closed_loop": loop,
        "fused_vs_stepped": fused,
        "near_tie_noise": NEAR_TIE_NOISE,
        "fused_tie": {"draw_gap": FUSED_DRAW_GAP, "noise_units": NEAR_TIE_NOISE},
        # Core ML calls per frame: the slow chunks (the last gives the head's logits), then the fast AR's
        # one fused call or 10 stepped
        "calls_per_frame": {FRAME: len(chunks) + 1, DECODE: len(chunks) + embed.cfg.num_codebooks},
        "checks": checks,
        "passed": all(checks.values()),
        "meets_target": all(checks.values()) and tf["slow_hidden_min_db"] >= gate.target_snr_db,
        "seconds": {"teacher_forced": tf["seconds"]["total"], "closed_loop": loop["seconds"]["total"],
                    **{f"fused_vs_stepped_{m}": sum(r["seconds"].values()) for m, r in fused.items()}},
        "provenance": provenance(),
    }
