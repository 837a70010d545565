"""Time to first audio and whole-request time of a cloned voice with and without the prefix cache.

Measured (a built model dir, this CPU): a voice registered from ~10 s of reference codes (its system
turn prefilled once, as the server's voice store does when a voice is added), then the same greedy
request spoken alternately without the cache (its whole prompt prefilled) and from it (rows B..T
only), `--repeats` times per backend; medians. Greedy codes of both paths must be equal.

Projected (no run): S2 Pro's prefill saving, from the declared config's slow-chunk weight bytes
(benchmarks/results/fish_runtime_projection_fish-s2-pro.json): a prefill block of P rows reads every
slow chunk's weights once, so a cached row saves slow_bytes / (P x bandwidth x 0.75).

    python benchmarks/fish_prefix_cache.py --model-dir artifacts/fish-tiny
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from anetts.models.fish.prefix import DEFAULT_MB
from anetts.models.fish.runtime import FRAME_SECONDS

TEXT = "The quick brown fox jumps over the lazy dog."
TRANSCRIPT = "This is the transcript of the reference clip, about ten seconds of a speaker reading aloud."
PROJECTION = ROOT / "benchmarks" / "results" / "fish_runtime_projection_fish-s2-pro.json"


def reference_voice(tts, seconds: float):
    """A voice from `seconds` of stand-in reference codes (the codec's frame rate), made as a registration makes it."""
    from anetts.models.fish.reference import reference_codes

    frames = round(seconds / FRAME_SECONDS)
    return tts.make_voice(TRANSCRIPT, codes=reference_codes(tts.cfg, frames, seed=7)), frames


def one_request(tts, voice, max_frames: int) -> dict:
    """Seconds to the first audio block and to the end, the codes and the prefill counts of one greedy request."""
    t0 = time.perf_counter()
    first, codes, timings = None, [], {}
    for block in tts.stream(TEXT, voice, temperature=0, max_frames=max_frames):
        if first is None and block.audio is not None and len(block.audio):
            first = time.perf_counter() - t0
        codes.append(block.codes)
        for k, v in (block.timings or {}).items():
            timings[k] = timings.get(k, 0.0) + v
    return {"first_audio_s": first, "total_s": time.perf_counter() - t0, "codes": np.concatenate(codes),
            "prefill_s": timings["prefill"], "prefill_rows": int(timings["prefill_rows"]),
            "prefill_cached_rows": int(timings["prefill_cached_rows"])}


def median(runs: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 4)


def measure(model_dir: Path, backend: str, seconds: float, repeats: int, max_frames: int, threads: int) -> dict:
    import anetts

    tts = anetts.load(model_dir, backend=backend, threads=threads)
    tts.warmup()
    voice, frames = reference_voice(tts, seconds)
    tts.set_prefix_cache_mb(0)
    one_request(tts, voice, max_frames)  # untimed: first calls of each package
    runs: dict[str, list[dict]] = {"uncached": [], "cached": []}
    prepare: list[float] = []
    for _ in range(repeats):  # alternated, so drift of this shared machine falls on both alike
        tts.set_prefix_cache_mb(0)  # drops the snapshot: the whole prompt prefilled
        runs["uncached"].append(one_request(tts, voice, max_frames))
        tts.set_prefix_cache_mb(DEFAULT_MB)
        t0 = time.perf_counter()
        if not tts.prepare_voice(voice):  # what the voice store does when the voice is added
            raise SystemExit(f"{backend}: the voice's system turn did not go into the cache")
        prepare.append(time.perf_counter() - t0)
        runs["cached"].append(one_request(tts, voice, max_frames))
    equal = all(np.array_equal(r["codes"], runs["uncached"][0]["codes"]) for rs in runs.values() for r in rs)
    prompt_rows = runs["uncached"][0]["prefill_rows"]
    out = {"reference_frames": frames, "reference_seconds": round(frames * FRAME_SECONDS, 2),
           "context": tts.context, "prefill_block": tts.prefill_tokens,
           "prompt_rows": prompt_rows, "cached_rows": runs["cached"][0]["prefill_cached_rows"],
           "frames": len(runs["uncached"][0]["codes"]), "prepare_voice_s": round(statistics.median(prepare), 4),
           "greedy_codes_equal": equal, "repeats": repeats}
    for mode, rs in runs.items():
        out[mode] = {k: median(rs, k) for k in ("first_audio_s", "total_s", "prefill_s")}
        out[mode]["first_audio_s_all"] = [round(r["first_audio_s"], 4) for r in rs]
        out[mode]["total_s_all"] = [round(r["total_s"], 4) for r in rs]
    u, c = out["uncached"], out["cached"]
    out["first_audio_saved_s"] = round(u["first_audio_s"] - c["first_audio_s"], 4)
    out["first_audio_speedup"] = round(u["first_audio_s"] / c["first_audio_s"], 3)
    out["prefill_share_of_first_audio_uncached"] = round(u["prefill_s"] / u["first_audio_s"], 3)
    out["prefill_per_row_ms_uncached"] = round(u["prefill_s"] / prompt_rows * 1000, 4)
    return out


def s2_pro_projection(cached_rows: int, reference_frames: int, prefill_block: int) -> dict:
    """The prefill a cached prefix saves at S2 Pro size, from the declared slow-chunk bytes, for two prefix
    lengths: this run's (fish-tiny's byte-level tokenizer: a row per byte of the system prompt and
    transcript) and the reference codes' rows alone (S2 Pro's BPE adds its text tokens on top)."""
    p = json.loads(PROJECTION.read_text())
    slow, eff = p["bytes_per_frame"]["slow_chunks"], p["effective_bandwidth"]
    rows = {"this_run": cached_rows, "reference_codes_only": reference_frames // prefill_block * prefill_block}
    chips = {}
    for chip, row in p["projection"].items():
        block_ms = slow / (row["bandwidth_gbs"] * 1e9 * eff) * 1000
        chips[chip] = {"bandwidth_gbs": row["bandwidth_gbs"], "prefill_block_ms": round(block_ms, 2),
                       **{f"saved_ms_{k}": round(n / prefill_block * block_ms, 1) for k, n in rows.items()}}
    return {"source": f"{PROJECTION.relative_to(ROOT)} ({p['source']}): bytes_per_frame.slow_chunks, "
                      "effective_bandwidth, projection.*.bandwidth_gbs",
            "formula": "saved_ms = cached_rows / P x slow_chunk_bytes / (bandwidth x effective_bandwidth); a "
                       "prefill block of P rows reads every slow chunk's weights once (memory-bound, as the "
                       "decode projection assumes); its compute and the calls' overheads are not counted",
            "not_measured": "no S2 Pro prefill has been timed (no Mac run; the Linux full-size runs time whole "
                            "requests, not their prefill): this is a bandwidth projection, not a measurement",
            "cached_rows": rows, "prefill_block": prefill_block, "slow_chunk_bytes": slow,
            "effective_bandwidth": eff, "chips": chips}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, default=ROOT / "artifacts" / "fish-tiny")
    ap.add_argument("--backends", default="torch,mil")
    ap.add_argument("--reference-seconds", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-frames", type=int, default=16, help="frames per request (default 16: two audio blocks)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    from anetts.provenance import provenance

    model = json.loads((args.model_dir / "manifest.json").read_text()).get("model", args.model_dir.name)
    result = {"model": model, "text": TEXT, "max_frames": args.max_frames, "threads": args.threads,
              "command": "python " + " ".join([Path(__file__).relative_to(ROOT).as_posix(), *(argv or sys.argv[1:])]),
              "load_average_at_start": [round(x, 2) for x in os.getloadavg()], "backends": {}}
    for backend in args.backends.split(","):
        r = measure(args.model_dir, backend, args.reference_seconds, args.repeats, args.max_frames, args.threads)
        result["backends"][backend] = r
        print(f"{model} {backend}: {r['reference_seconds']} s reference, prompt {r['prompt_rows']} rows, "
              f"{r['cached_rows']} cached; first audio {r['uncached']['first_audio_s']:.3f} -> "
              f"{r['cached']['first_audio_s']:.3f} s (x{r['first_audio_speedup']}), whole request "
              f"{r['uncached']['total_s']:.3f} -> {r['cached']['total_s']:.3f} s; codes equal: {r['greedy_codes_equal']}")
    first = next(iter(result["backends"].values()))
    result["s2_pro_projection"] = s2_pro_projection(first["cached_rows"], first["reference_frames"],
                                                    first["prefill_block"])
    for chip, row in result["s2_pro_projection"]["chips"].items():
        print(f"S2 Pro projected, {chip}: {row['saved_ms_this_run']} ms ({row['saved_ms_reference_codes_only']} ms "
              "for the codes' rows alone) of prefill saved per request")
    result["machine"] = provenance()
    out = args.out or ROOT / "benchmarks" / "results" / f"fish_prefix_cache_{model}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
