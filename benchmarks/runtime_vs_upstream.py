#!/usr/bin/env python
"""Paired benchmark: the runtime's torch backend vs upstream eager ``KModel`` on the same CPU.

Same weights (the model dir's ``weights/``), same voice, same token ids and style row, same
speed. Texts are prefixes of one passage cut to about 3, 7, 15 and 30 s of audio (the longest
prefix whose predicted length fits the target, so each lands in its seconds bucket). After a
warm-up (the TorchScript profiling executor needs two calls per shape), every iteration runs
both sides on every text, alternating which goes first. Reports warm medians, real-time factors
(wall / audio seconds), the ratio upstream_time / runtime_time (> 1: the runtime is faster) and
per-stage medians for both sides.

    python benchmarks/runtime_vs_upstream.py --model-dir artifacts/kokoro-82m --iterations 5 -o out.json
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from anetts.bench import PASSAGE, TARGETS_S, choose_prefixes  # noqa: E402  (one passage, one cut for both harnesses)
from anetts.models.kokoro.weights import load_kmodel  # noqa: E402
from anetts.provenance import provenance  # noqa: E402
from anetts.loader import load  # noqa: E402

log = logging.getLogger("runtime_vs_upstream")



def _median(xs):
    return float(statistics.median(xs))


class UpstreamStageClock:
    """Forward hooks on upstream modules: wall time per stage boundary of ``forward_with_tokens``.

    duration = bert .. duration_proj .. alignment (until predictor.shared starts);
    f0ntrain = predictor.F0Ntrain; text_encoder; decoder_pre = decoder until the generator;
    generator = decoder.generator incl. the hn-NSF source and STFT.
    """

    def __init__(self, model):
        self.marks: dict[str, float] = {}
        hooks = []

        def mark(name):
            def hook(*_):
                self.marks.setdefault(name, time.perf_counter())
            return hook

        hooks.append(model.predictor.shared.register_forward_pre_hook(mark("f0n_start")))
        hooks.append(model.text_encoder.register_forward_pre_hook(mark("te_start")))
        hooks.append(model.text_encoder.register_forward_hook(mark("te_end")))
        hooks.append(model.decoder.register_forward_pre_hook(mark("dec_start")))
        hooks.append(model.decoder.generator.register_forward_pre_hook(mark("gen_start")))
        self.hooks = hooks

    def run(self, fn):
        self.marks = {}
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        m = self.marks
        stages = {
            "duration": m["f0n_start"] - t0,
            "f0ntrain": m["te_start"] - m["f0n_start"],
            "text_encoder": m["te_end"] - m["te_start"],
            "decoder_pre": m["gen_start"] - m["dec_start"],
            "generator": t1 - m["gen_start"],
        }
        return out, t1 - t0, stages


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=Path("artifacts/kokoro-82m"))
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs per text and side first (>= 2 for TorchScript)")
    ap.add_argument("--voice", default=None)
    ap.add_argument("--speed", type=float, default=1.0)
    ap.add_argument("--lang", default="en-us")
    ap.add_argument("--threads", type=int, default=None, help="torch threads for both sides (default: torch's)")
    ap.add_argument("--targets", type=int, nargs="*", default=None, help=f"audio seconds (default {TARGETS_S})")
    ap.add_argument("--label", default=None, help="free text stored in the JSON (e.g. what was measured)")
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)

    tts = load(args.model_dir, backend="torch")
    voice = args.voice or tts.default_voice
    kmodel = load_kmodel(tts.artifacts.model_dir / tts.artifacts.manifest["weights_dir"])
    clock = UpstreamStageClock(kmodel)
    texts = choose_prefixes(tts, PASSAGE.split(), voice, args.speed, args.lang, tuple(args.targets or TARGETS_S))
    log.info("texts: %s", [(t["target_s"], len(t["ids"]), t["frames"]) for t in texts])

    def run_runtime(t):
        t0 = time.perf_counter()
        r = tts.synthesize_tokens(t["ids"], ref_s=t["ref_s"], speed=args.speed, seed=0)
        return r, time.perf_counter() - t0

    def run_upstream(t):
        ids = torch.tensor([t["ids"]], dtype=torch.long)
        ref = torch.from_numpy(t["ref_s"])
        torch.manual_seed(0)
        with torch.inference_mode():
            (audio, dur), wall, stages = clock.run(lambda: kmodel.forward_with_tokens(ids, ref, args.speed))
        return audio, dur, wall, stages

    results = {t["target_s"]: {"runtime": [], "upstream": [], "rt_stages": [], "up_stages": []} for t in texts}
    log.info("warm-up (%d per text and side)", args.warmup)
    for _ in range(args.warmup):
        for t in texts:
            r, _ = run_runtime(t)
            audio, dur, _, _ = run_upstream(t)
            t["durations_equal"] = bool(np.array_equal(r.pred_dur, dur.reshape(-1).numpy()))
            t["audio_s"] = r.seconds
            t["length_equal"] = int(audio.numel()) == r.audio.shape[0]
            t["buckets"] = r.buckets
    for it in range(args.iterations):
        runtime_first = it % 2 == 0
        for t in texts:
            res = results[t["target_s"]]
            for side in (("runtime", "upstream") if runtime_first else ("upstream", "runtime")):
                if side == "runtime":
                    r, wall = run_runtime(t)
                    res["runtime"].append(wall)
                    res["rt_stages"].append(r.timings)
                else:
                    _, _, wall, stages = run_upstream(t)
                    res["upstream"].append(wall)
                    res["up_stages"].append(stages)
        log.info("iteration %d/%d done", it + 1, args.iterations)

    rows = []
    for t in texts:
        res = results[t["target_s"]]
        rt, up = _median(res["runtime"]), _median(res["upstream"])
        rt_stage_keys = [k for k in res["rt_stages"][0] if k not in ("total", "load")]
        rows.append({
            "target_s": t["target_s"],
            "audio_s": t["audio_s"],
            "n_phonemes": len(t["phonemes"]),
            "n_tokens": len(t["ids"]),
            "frames": t["frames"],
            "buckets": t["buckets"],
            "durations_equal_upstream": t["durations_equal"],
            "length_equal_upstream": t["length_equal"],
            "text": t["text"],
            "runtime": {"median_s": rt, "rtf": rt / t["audio_s"], "all_s": res["runtime"],
                        "stages_median_s": {k: _median([s.get(k, 0.0) for s in res["rt_stages"]]) for k in rt_stage_keys}},
            "upstream": {"median_s": up, "rtf": up / t["audio_s"], "all_s": res["upstream"],
                         "stages_median_s": {k: _median([s[k] for s in res["up_stages"]]) for k in res["up_stages"][0]}},
            "ratio_upstream_over_runtime": up / rt,
        })
    ratios = [r["ratio_upstream_over_runtime"] for r in rows]
    report = {
        "benchmark": "runtime (torch backend) vs upstream eager KModel.forward_with_tokens",
        "label": args.label,
        "model_dir": str(args.model_dir),
        "model": tts.artifacts.name,
        "voice": voice,
        "speed": args.speed,
        "iterations": args.iterations,
        "warmup": args.warmup,
        "torch_threads": torch.get_num_threads(),
        "texts": rows,
        "summary": {
            "ratio_median": _median(ratios),
            "ratio_min": min(ratios),
            "ratio_total": sum(r["upstream"]["median_s"] for r in rows) / sum(r["runtime"]["median_s"] for r in rows),
            "not_slower_than_upstream": min(ratios) >= 1.0,
        },
        "notes": [
            "times are wall seconds per utterance from token ids (no G2P), warm medians",
            "runtime stages: duration includes the text encoder (one artifact); har = host hn-NSF source + STFT",
            "upstream stages: duration includes the alignment matmul; generator includes m_source and the STFT",
        ],
        "provenance": provenance(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    for r in rows:
        log.info("%4.1f s audio: runtime %.3f s (RTF %.3f), upstream %.3f s (RTF %.3f), ratio %.2f",
                 r["audio_s"], r["runtime"]["median_s"], r["runtime"]["rtf"], r["upstream"]["median_s"],
                 r["upstream"]["rtf"], r["ratio_upstream_over_runtime"])
    log.info("wrote %s", args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
