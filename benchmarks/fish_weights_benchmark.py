"""Fish weights benchmark: synthesize a preset, validate it, load one slow-AR chunk.

Each phase runs in its own process so its peak RSS is its own (ru_maxrss of the child):
  synth     make_synthetic (streamed shards)
  validate  validate_weights_dir with the value check (reads every tensor once)
  load      load_slow_layers for the first `--chunk-layers` layers (per-layer loader), every value touched

    python benchmarks/fish_weights_benchmark.py --preset fish-s2-pro --out /tmp/fish-s2 -o fish_weights.json
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from anetts.provenance import provenance  # noqa: E402


def _phase(name: str, preset: str, out: Path, chunk_layers: int) -> dict:
    from anetts.models.fish import loader, weights

    t0 = time.perf_counter()
    info: dict = {}
    if name == "synth":
        info = weights.make_synthetic(out, preset, seed=0)
    elif name == "validate":
        weights.validate_weights_dir(out, check_values=True)
    elif name == "load":
        tensors = loader.load_slow_layers(out, 0, chunk_layers)
        # safetensors maps the shard lazily: touch every value so the bytes are really read
        checksum = sum(float(t.float().sum()) for t in tensors.values())
        info = {"layers": chunk_layers, "tensors": len(tensors), "checksum": checksum,
                "bytes": sum(t.numel() * t.element_size() for t in tensors.values())}
    else:
        raise ValueError(f"unknown phase {name!r}")
    info["wall_s"] = round(time.perf_counter() - t0, 2)
    # Linux reports ru_maxrss in KiB
    info["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="fish-s2-pro")
    ap.add_argument("--out", type=Path, required=True, help="scratch weights directory (removed unless --keep)")
    ap.add_argument("--chunk-layers", type=int, default=9)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("-o", "--output", type=Path, help="write the figures as JSON here")
    ap.add_argument("--phase", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.phase:
        print(json.dumps(_phase(a.phase, a.preset, a.out, a.chunk_layers)))
        return 0
    if a.out.exists():
        sys.exit(f"--out {a.out} exists; give a fresh scratch directory")
    free = shutil.disk_usage(a.out.parent if a.out.parent.exists() else Path.cwd()).free
    result = {"preset": a.preset, "disk_free_before_gib": round(free / 2**30, 1), "phases": {}}
    try:
        for phase in ("synth", "validate", "load"):
            cmd = [sys.executable, __file__, "--phase", phase, "--preset", a.preset, "--out", str(a.out),
                   "--chunk-layers", str(a.chunk_layers)]
            done = subprocess.run(cmd, check=True, capture_output=True, text=True)
            result["phases"][phase] = json.loads(done.stdout.strip().splitlines()[-1])
            print(phase, result["phases"][phase], flush=True)
        result["disk_bytes"] = sum(p.stat().st_size for p in a.out.iterdir())
        result["disk_gib"] = round(result["disk_bytes"] / 2**30, 2)
    finally:
        if not a.keep:
            shutil.rmtree(a.out, ignore_errors=True)
    result["provenance"] = provenance()
    text = json.dumps(result, indent=2)
    print(text)
    if a.output:
        a.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
