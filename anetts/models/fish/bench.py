"""Fish's end-to-end workload for `anetts bench`: per frame and per stage.

Each case generates a fixed number of frames (about 3, 7, 15, 30 s of audio, as many as the context
leaves after the prompt) greedily from the opening words of the passage, never stopping at
<|im_end|>, so every round times the same work: the prompt's prefill through the slow chunks, then per
frame the semantic draw, the fast AR and one decode step through the slow chunks (the last one's
head included); then the codec over
all frames, when the build has one. The fast AR runs once per function its package has: `frame` (one
fused call per frame) and `decode` (10 stepped calls), each its own case and row
(`fast_ar_function`). The rows give the medians per part and per frame.
No upstream side: upstream's PyTorch S2 Pro is not timed here (`upstream` records why)."""
from __future__ import annotations

import time

import numpy as np

from anetts.bench import PASSAGE, BenchError, Workload, stats, usable_targets
from anetts.models.fish.runtime import FRAME_SECONDS
from anetts.models.fish.sampling import DECODE, FRAME

TEXT_WORDS = 8  # the prompt: the passage's opening words (frames, not text, set the work here)
FRAME_PARTS = ("sample", "fast", "slow")  # the runtime's per-frame timings (FishDecoder)


def workload(tts, *, targets, upstream, voice=None, speed=None, lang=None) -> Workload:
    given = [name for name, v in (("--voice", voice), ("--speed", speed), ("--lang", lang)) if v is not None]
    if given:
        raise BenchError(f"{', '.join(given)}: a Fish build has no voices, speed or language setting "
                         "(its voice comes from a reference clip); leave them out")
    text = " ".join(PASSAGE.split()[:TEXT_WORDS])
    rows = tts.prompt(text)
    room = tts._room(rows.shape[1])  # frames the context leaves after this prompt
    chosen = [(t, min(room, round(t / FRAME_SECONDS))) for t in usable_targets(targets, room * FRAME_SECONDS)]

    have = {f.name for f in tts.artifacts.package("fast_ar", tts.fast_bucket).functions}
    functions = [fn for fn in (FRAME, DECODE) if fn in have]

    def run(n: int, fn: str):
        tts.decoder.fast_function = fn
        try:
            r = tts.generate_codes(rows, n, temperature=0.0, stop_at_end=False)
        finally:
            tts.decoder.fast_function = None
        timings = dict(r["timings"])
        if tts.has_codec:
            t0 = time.perf_counter()
            tts.decode_audio(r["codes"])
            timings["codec"] = time.perf_counter() - t0
            timings["total"] += timings["codec"]
        return timings["total"], {**timings, "frames": int(r["codes"].shape[0])}

    def case(t, fn: str) -> str:
        return f"e2e:{t}" if fn == FRAME else f"e2e:{t}:{fn}"

    cases = {case(t, fn): (lambda n=n, fn=fn: run(n, fn)) for t, n in chosen for fn in functions}

    def rows_(samples: dict, details: dict) -> list[dict]:
        out = []
        for (t, n), fn in ((c, fn) for c in chosen for fn in functions):
            d = details[case(t, fn)]
            warm = stats(samples[case(t, fn)])
            med = {k: float(np.median([x.get(k, 0.0) for x in d])) for k in ("prefill", *FRAME_PARTS, "codec") if k in d[0]}
            per_frame = {k: float(np.median([x.get(k, 0.0) / x["frames"] for x in d])) for k in FRAME_PARTS}
            per_frame["frame"] = float(np.median([sum(x.get(k, 0.0) for k in FRAME_PARTS) / x["frames"] for x in d]))
            audio_s = n * FRAME_SECONDS
            out.append({"target_s": t, "fast_ar_function": fn, "text": text, "prompt_tokens": int(rows.shape[1]), "frames": n,
                        "audio_s": audio_s, "buckets": {"slow": tts.bucket, "fast_ar": tts.fast_bucket},
                        "warm": warm, "rtf_median": warm["median_s"] / audio_s, "stages_median_s": med,
                        "per_frame_median_s": per_frame, "frames_per_s": 1.0 / per_frame["frame"],
                        "upstream": {}})
        return out

    reason = "anetts bench times no upstream side for Fish builds (upstream S2 Pro in PyTorch is not run here)"
    return Workload(cases, rows_, settings={"text": text, "targets_s": [t for t, _ in chosen], "temperature": 0.0},
                    upstream={d: {"available": False, "reason": reason} for d in upstream or ()},
                    notes=["end to end = FishRuntime.generate_codes (greedy, a fixed frame count) + the codec",
                           "per_frame_median_s: sampling, fast AR (fused: 1 call; stepped: 10), one slow decode step (head included)",
                           "fast_ar_function: frame (fused, the runtime's default) or decode (stepped)"])
