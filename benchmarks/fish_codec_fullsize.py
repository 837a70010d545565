"""The Fish codec stage at S2 Pro size: export, convert and MIL parity per bucket, each in its own process.

Writes a synthetic full-size codec (fish-speech's modded_dac_vq.yaml, 391 M parameters; `codec.pth`
+ the fish-s2-pro `config.json`) unless `--weights` already holds one, then runs, per bucket, the
three jobs the DAG runs (rules export, convert, parity: `export_stage`, `convert_export` with the
config's fp16 / macOS15 options, `run_parity` on the MIL executor against upstream's fp32 decode)
as separate processes, and records each one's wall seconds and peak RSS (ru_maxrss of that child,
read with wait4), the package bytes and the SNR.

    nice -n 10 python benchmarks/fish_codec_fullsize.py --work /tmp/codec-full --buckets 16 64 \\
        -o benchmarks/results/fish_codec_fullsize_s2pro.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from anetts.provenance import provenance  # noqa: E402


def _child(step: str, weights: Path, out: Path, size: int) -> dict:
    if step == "synth":
        from anetts.models.fish import codec as C
        from anetts.models.fish import presets

        weights.mkdir(parents=True, exist_ok=True)
        (weights / "config.json").write_text(json.dumps(presets.preset("fish-s2-pro").config, indent=2) + "\n")
        return C.write_synthetic_codec(weights, C.s2_pro_config(), seed=0)
    out.mkdir(parents=True, exist_ok=True)
    if step == "export":
        from anetts.compile.export import export_stage
        from anetts.families import get_family
        from anetts.scenario import load_scenario

        r = export_stage(get_family("fish"), "codec", f"f{size}", size, None, weights, None, out / "c.functions",
                         out / "c.scenario.npz", out / "c.export.json")
        (call,) = load_scenario(out / "c.scenario.npz")[0].calls
        return {"seconds": r["seconds"], "valid_regions": {k: list(v) for k, v in call.valid.items()}}
    if step == "convert":
        from anetts.compile.convert import ConvertOptions, convert_export

        opts = ConvertOptions.make(deployment_target="macOS15", precision="fp16", compute_units="CPU_AND_GPU")
        r = convert_export(out / "c.functions", out / "c.export.json", out / "c.mlpackage", out / "c.json", opts,
                           {"model": "fish-s2-pro", "family": "fish"})
        return {"bytes": r["bytes"], "seconds": r["seconds"]}
    if step == "parity":
        from anetts.options import Gate
        from anetts.verify.parity import run_parity

        r = run_parity(out / "c.mlpackage", out / "c.scenario.npz", out / "c.export.json", Gate.make())
        mil = r["backends"]["mil"]
        return {"passed": r["passed"], "mil_min_snr_db": mil["min_snr_db"], "mil_seconds": round(mil["seconds"], 3)}
    raise ValueError(f"unknown step {step!r}")


def _run(step: str, weights: Path, out: Path, size: int) -> dict:
    """One step in a forked child: its result, wall seconds and peak RSS (MiB)."""
    r, w = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            payload = {"ok": _child(step, weights, out, size)}
        except BaseException as e:  # reported by the parent, which fails the run
            payload = {"error": f"{type(e).__name__}: {e}"}
        with os.fdopen(w, "w") as fh:
            json.dump(payload, fh)
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as fh:
        payload = json.loads(fh.read() or '{"error": "child died"}')
    _, status, usage = os.wait4(pid, 0)
    if "error" in payload or status != 0:
        raise SystemExit(f"{step} f{size}: {payload.get('error', f'exit status {status}')}")
    return {**payload["ok"], "wall_s": round(time.perf_counter() - t0, 2), "max_rss_mib": round(usage.ru_maxrss / 1024, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="scratch directory (weights and exports go here)")
    ap.add_argument("--weights", type=Path, help="a directory with codec.pth + config.json (default: synthesized in --work)")
    ap.add_argument("--buckets", type=int, nargs="+", default=[16], help="frames per bucket")
    ap.add_argument("-o", "--output", type=Path, help="write the JSON here (default: stdout)")
    args = ap.parse_args(argv)
    weights = args.weights or args.work / "weights"
    result = {"weights": str(weights), "buckets": {}, "provenance": provenance()}
    if not (weights / "codec.pth").is_file():
        result["synth"] = _run("synth", weights, args.work, 0)
        print("synth", result["synth"], flush=True)
    for size in args.buckets:
        out = args.work / f"f{size}"
        steps = {}
        for step in ("export", "convert", "parity"):
            steps[step] = _run(step, weights, out, size)
            print(f"f{size} {step}", steps[step], flush=True)
        result["buckets"][f"f{size}"] = steps
    text = json.dumps(result, indent=1) + "\n"
    if args.output:
        args.output.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
