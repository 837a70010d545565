"""Stateful parity at a larger size: KV-cache attention (benchmarks/lib/kv_example.py) converted with
fp16 states into one prefill/decode package, then a prefill + many-decode-step scenario on the MIL
executor vs eager torch.  Prints per-call dB and seconds (does fp16 state drift over the steps?) and
writes them as JSON.

    python benchmarks/stateful_scenario.py --dim 512 --heads 8 --context 256 --prefill 64 --steps 32 -o out.json
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from anetts.compile.convert import ConvertOptions  # noqa: E402
from anetts.compile.export import compile_module, record_eager  # noqa: E402
from anetts.options import Gate  # noqa: E402
from anetts.provenance import provenance  # noqa: E402
from anetts.verify.parity import run_scenario  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks" / "lib"))
import kv_example as kv  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--prefill", type=int, default=64)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--linear-rewrite", default="none", choices=("none", "conv1d", "conv2d"))
    p.add_argument("-o", "--output", type=Path, help="JSON file for the figures")
    a = p.parse_args(argv)

    g = kv.KVGeometry(a.dim, a.heads, a.context)
    torch.manual_seed(0)
    model = kv.KVAttention(g).eval()
    scenario = kv.prefill_decode(g, a.prefill, a.steps)
    t0 = time.perf_counter()
    reference = record_eager(copy.deepcopy(model), scenario)
    t_eager = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="stateful-bench-") as tmp:
        t0 = time.perf_counter()
        options = ConvertOptions(deployment_target="macOS15", precision="fp16", linear_rewrite=a.linear_rewrite)
        package, _ = compile_module(model, kv.functions(g, a.prefill).values(), Path(tmp), options,
                                    {"model": "kv-bench", "family": "test"}, "attn", geometry={"context": g.context})
        t_convert = time.perf_counter() - t0
        report = run_scenario(package, scenario, reference, Gate())
    mil = report["backends"]["mil"]
    calls = [{"call": r["call"], "function": r["function"], "y_snr_db": r["outputs"]["y"]["snr_db"],
              **{f"{k}_snr_db": m["snr_db"] for k, m in r["states"].items()}, "passed": r["passed"]}
             for r in mil["calls"]]
    print(f"KV attention dim {g.dim}, {g.heads} heads, context {g.context}: prefill {a.prefill}, {a.steps} decode steps")
    print(f"  eager {t_eager:.2f} s, export+convert+bundle {t_convert:.1f} s, MIL scenario {mil['seconds']:.2f} s")
    for c in calls:
        states = ", ".join(f"{k[:-7]} {v:.1f}" for k, v in c.items() if k.endswith("_cache_snr_db"))
        print(f"  call {c['call']:>3} {c['function']:<7} y {c['y_snr_db']:.1f} dB  ({states} dB)")
    print(f"  worst {mil['min_snr_db']:.1f} dB; passed {report['passed']}")
    out = {"geometry": vars(a) | {"head_dim": g.head_dim}, "seconds": {"eager": round(t_eager, 3),
           "convert": round(t_convert, 2), "mil_scenario": mil["seconds"]},
           "min_snr_db": mil["min_snr_db"], "passed": report["passed"], "calls": calls, "provenance": provenance()}
    if a.output:
        out["geometry"]["output"] = str(a.output)
        a.output.write_text(json.dumps(out, indent=1) + "\n")
        print(f"  wrote {a.output}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
