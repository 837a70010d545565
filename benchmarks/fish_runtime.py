"""Fish runtime speed on this CPU, and the bandwidth floor of a frame on Apple silicon.

Measured (a built model dir): greedy frames/s of the runtime (mil backend: the compiled packages on
the MIL executor; torch: the fp32 TorchScript exports) against upstream eager greedy generation
(fish-speech 0.1.0 + the S2 adaptation, `reference.py`) on the same prompt, CPU and thread count;
time to the first frame's codes; rtf = wall / audio and rtfx = audio / wall (46.44 ms of audio per frame).

Projected (no run): the weight bytes one frame reads (every slow chunk once, the restricted LM head
once, the fast AR 10 times; the embedding gathers read a row each and are left out, as is the KV
cache) and the resulting floor in ms/frame at 75 % of the memory bandwidth of M1 (68 GB/s),
M4 Pro (273) and M2 Max (400). From the artifacts' weight files for a build; from the declared
config for a model (e.g. fish-s2-pro, fp16) without building it.

    python benchmarks/fish_runtime.py --model-dir artifacts/fish-tiny
    python benchmarks/fish_runtime.py --projection-only --model fish-s2-pro
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from anetts.models.fish.frame_cost import EFFECTIVE, FP16, FRAME_MS, frame_bytes, head_bytes, projection  # noqa: E402


def config_bytes(cfg) -> dict:
    """fp16 weight bytes per frame from a FishConfig: slow layers + final norm, restricted head, 10 fast passes."""
    return frame_bytes(cfg)


def artifact_bytes(model_dir: Path, cfg) -> dict:
    """The same from the built packages' weight files (the fast AR's input-embedding table, a one-row
    gather per pass, subtracted)."""
    m = json.loads((model_dir / "manifest.json").read_text())

    def weights(p):
        return sum(f.stat().st_size for f in (model_dir / p["path"]).rglob("weight.bin"))

    head = head_bytes(cfg)  # the restricted head, fp16 in the last slow chunk's package
    slow = sum(weights(p) for p in m["packages"] if p["stage"].startswith("slow_chunk")) - head
    fast = sum(weights(p) for p in m["packages"] if p["stage"] == "fast_ar") - cfg.codebook_size * cfg.fast.dim * FP16
    return {"slow_chunks": slow, "lm_head": head, "fast_ar_x10": cfg.num_codebooks * fast}


def upstream_greedy(model, cfg, prompt: np.ndarray, n: int) -> tuple[np.ndarray, float, float]:
    """Upstream's eager greedy generation (the S2 decode step of reference.reference_decode, no hooks):
    codes, seconds to the first frame, total seconds."""
    import torch

    from anetts.models.fish.reference import _reset_fast_cache, prepare_decode, semantic_bias

    bias = semantic_bias(cfg)
    codes_out, first = [], None
    t0 = time.perf_counter()
    with torch.inference_mode():
        T = prompt.shape[1]
        prepare_decode(model, cfg, T + n)
        x, pos = torch.from_numpy(prompt)[None], torch.arange(T)
        for f in range(n):
            r = model.forward_generate(x, pos)
            token = int(torch.argmax(r.logits[0, -1].float() + bias))
            hidden = r.hidden_states[0, -1]
            codes = [min(max(token - cfg.semantic_begin_id, 0), cfg.codebook_size - 1)]
            _reset_fast_cache(model)
            model.forward_generate_fast(hidden[None], torch.tensor([0]))
            h = model.fast_embeddings(torch.tensor([codes[0]]))
            for i in range(1, cfg.num_codebooks):
                codes.append(int(torch.argmax(model.forward_generate_fast(h, torch.tensor([i]))[0, -1])))
                h = model.fast_embeddings(torch.tensor([codes[-1]]))
            codes_out.append(codes)
            first = time.perf_counter() - t0 if first is None else first
            x = torch.tensor([token, *codes]).view(1, cfg.num_codebooks + 1, 1)
            pos = torch.tensor([T + f])
    return np.asarray(codes_out), first, time.perf_counter() - t0


def run_runtime(model_dir: Path, backend: str, rows: np.ndarray, n: int, threads: int) -> dict:
    import anetts

    tts = anetts.load(model_dir, backend=backend, threads=threads)
    t0 = time.perf_counter()
    tts.warmup()
    load_s = time.perf_counter() - t0
    timings: dict = {}
    from collections import defaultdict

    timings = defaultdict(float)
    first, codes = None, []
    t0 = time.perf_counter()
    for _, c in tts.iter_codes(rows, n, temperature=0, stop_at_end=False, timings=timings):
        codes.append(c or [0] * 10)
        first = time.perf_counter() - t0 if first is None else first
    wall = time.perf_counter() - t0
    return {"codes": np.asarray(codes), "first_s": first, "wall_s": wall, "load_s": load_s,
            "stages_s": {k: round(v, 3) for k, v in timings.items()}}


def summary(frames: int, first: float, wall: float) -> dict:
    audio = frames * FRAME_MS / 1000
    return {"frames": frames, "wall_s": round(wall, 3), "frames_per_s": round(frames / wall, 2),
            "ms_per_frame": round(wall / frames * 1000, 2), "time_to_first_codes_s": round(first, 3),
            "audio_s": round(audio, 3), "rtf": round(wall / audio, 3), "rtfx": round(audio / wall, 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, default=ROOT / "artifacts" / "fish-tiny")
    ap.add_argument("--frames", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for all three (default 1)")
    ap.add_argument("--backends", default="mil,torch")
    ap.add_argument("--projection-only", action="store_true", help="only the bandwidth projection of --model's config")
    ap.add_argument("--model", default="fish-s2-pro", help="preset for --projection-only")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    from anetts.models.fish.config import FishConfig

    if args.projection_only:
        from anetts.models.fish.presets import preset

        cfg = FishConfig.from_dict(preset(args.model).config, args.model)
        b = config_bytes(cfg)
        result = {"model": args.model, "source": "declared config (fp16), not built",
                  "bytes_per_frame": b, "total_bytes_per_frame": sum(b.values()),
                  "effective_bandwidth": EFFECTIVE, "projection": projection(b)}
        out = args.out or ROOT / "benchmarks" / "results" / f"fish_runtime_projection_{args.model}.json"
    else:
        import torch

        from anetts.models.fish import reference as R
        from anetts.models.fish.tokenizer import load_tokenizer

        torch.set_num_threads(args.threads)
        mdir = args.model_dir
        cfg = FishConfig.from_json(mdir / "assets" / "config.json")
        tk = load_tokenizer(mdir / "assets" / "tokenizer.json", cfg)
        rows = R.make_prompt(cfg, tk)
        model, _ = R.load_reference_model(mdir / "weights")
        up_codes, up_first, up_wall = upstream_greedy(model, cfg, rows, args.frames)
        result = {"model": mdir.name, "prompt_tokens": int(rows.shape[1]), "threads": args.threads,
                  "cpu": f"{__import__('platform').processor() or __import__('platform').machine()}, "
                         f"{__import__('os').cpu_count()} cores (shared)",
                  "upstream_eager_fp32": summary(args.frames, up_first, up_wall), "runtime": {}}
        for be in args.backends.split(","):
            r = run_runtime(mdir, be, rows, args.frames, args.threads)
            eq = (r["codes"] == up_codes).all(axis=1)
            s = summary(args.frames, r["first_s"], r["wall_s"])
            s.update(load_and_verify_s=round(r["load_s"], 3), stages_s=r["stages_s"],
                     frames_equal_to_upstream_greedy=int(eq.sum()),
                     first_divergent_frame=None if eq.all() else int(np.argmin(eq)),
                     speed_vs_upstream=round(s["frames_per_s"] / result["upstream_eager_fp32"]["frames_per_s"], 3))
            result["runtime"][be] = s
        b = artifact_bytes(mdir, cfg)
        result.update(bytes_per_frame=b, total_bytes_per_frame=sum(b.values()), effective_bandwidth=EFFECTIVE,
                      projection=projection(b))
        out = args.out or ROOT / "benchmarks" / "results" / f"fish_runtime_{mdir.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
