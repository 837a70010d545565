#!/usr/bin/env python
"""Which ops the generator needs in fp32: convert one export per `fp32_ops` variant, gate it, compare.

For each bucket and variant, the generator export already in artifacts/<model>/export/ (build it with
`snakemake artifacts/<model>/export/generator/<b>s.scenario.npz --config model=<model>`) is converted with
the project's own `convert_export` (stage options from config.yaml, `fp32_ops` replaced by the
variant's list, `precision` fp32 for the variant `fp32`), then scored with the parity job's
`run_parity` (MIL executor vs the export's eager fp32 outputs). Per row: worst-output SNR, package
bytes, op and cast counts, and the lint findings (the ANE-placement cost as far as Linux can tell).

    nice python benchmarks/generator_fp32_ops.py --model kokoro-82m-onnx --buckets 3 7 \\
        --variants fp16 config tail -o benchmarks/results/generator_fp32_ops.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from anetts import artifacts  # noqa: E402
from anetts.compile.convert import convert_export  # noqa: E402
from anetts.options import ConvertOptions, Gate  # noqa: E402
from anetts.verify.parity import run_parity  # noqa: E402

TAIL = ["module:conv_post", "module:spectrum", "module:istft"]
STATS = ["op:reduce_mean", "op:rsqrt", "op:sub", "op:real_div"]
# named variants; "config" is config.yaml's own generator list, "fp32" the all-fp32 program
VARIANTS = {
    "fp16": [],
    "tail": TAIL,
    "tail+stats": TAIL + STATS,
    "elementwise-no-istft": ["module:conv_post", "module:spectrum", *STATS, "op:add", "op:mul", "op:sin", "op:pow"],
    "elementwise-no-stats": TAIL + ["op:add", "op:mul", "op:sin", "op:pow"],
    "elementwise-no-snake": TAIL + STATS + ["op:add", "op:mul"],
}


def stage_block() -> dict:
    cfg = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    return {k: v for k, v in cfg["families"]["kokoro"]["stages"]["generator"].items() if k != "buckets"}


def measure(model: str, bucket: int, variant: str, work: Path) -> dict:
    block = stage_block()
    if variant == "fp32":
        block.update(precision="fp32", fp32_ops=[])
    elif variant != "config":
        block["fp32_ops"] = VARIANTS[variant]
    options = ConvertOptions.make(**block)
    ex = artifacts.model_dir(model, REPO / "artifacts") / "export" / "generator"
    b = f"{bucket}s"
    out = work / f"{b}-{variant}"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rep = convert_export(ex / f"{b}.functions", ex / f"{b}.export.json", out / "g.mlpackage", out / "g.json", options,
                         {"model": model}, out_inspect=out / "inspect.json")
    par = run_parity(out / "g.mlpackage", ex / f"{b}.scenario.npz", ex / f"{b}.export.json",
                     Gate.make())
    info = json.loads((out / "inspect.json").read_text(encoding="utf-8"))["functions"]["main"]
    return {
        "bucket": b, "variant": variant, "precision": options.precision, "fp32_ops": list(options.fp32_ops),
        "mil_min_snr_db": par["backends"]["mil"]["min_snr_db"], "passed": par["passed"], "bytes": rep["bytes"],
        "op_count": info["op_count"], "casts": info["ops"].get("cast", 0), "weight_dtypes": info["weight_dtypes"],
        "fp32_ops_matched": rep["fp32_ops"],
        "lint": [{k: f[k] for k in ("rule", "severity", "count", "message")} for f in rep["lint"]],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="kokoro-82m-onnx")
    ap.add_argument("--buckets", type=int, nargs="+", default=[3])
    ap.add_argument("--variants", nargs="+", default=["fp16", "config"],
                    choices=[*VARIANTS, "config", "fp32"])
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="generator_fp32_ops-") as tmp:
        for bucket in args.buckets:
            for variant in args.variants:
                row = measure(args.model, bucket, variant, Path(tmp))
                fp32 = next((f["count"] for f in row["lint"] if f["rule"] == "fp32_compute"), 0)
                print(f"{row['bucket']:4s} {variant:22s} {row['mil_min_snr_db']:7.2f} dB  {row['bytes']:>10,d} B  "
                      f"fp32 ops {fp32:4d}  casts {row['casts']:3d}")
                rows.append(row)
    result = {"model": args.model, "stage": "generator", "gate": "MIL executor vs eager fp32 (parity job)", "rows": rows}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
