#!/usr/bin/env python
"""Per-op SNR along a program: every var of a test package vs the same var of a reference package.

Both packages come from the same export (e.g. the fp16 or mixed program vs the fp32 one, converted
by benchmarks/generator_fp32_ops.py or the DAG). The test package runs in the MIL executor keeping
every var; the reference then runs op by op, and each output is compared with the test program's var
of the same name (the fp16 pass names its ops `<name>_cast_fp16`). Shows where precision is lost:
on real Kokoro weights this is how the generator's AdaIN rsqrt (24 dB: subnormal fp16 squares of
channels with std 0.003) and its phase tail (sin of conv_post's phase channels) were found.
Keeps the test program's vars in memory: use a short bucket.

    nice python benchmarks/mil_precision_profile.py TEST.mlpackage REF.mlpackage \\
        artifacts/kokoro-82m-onnx/export/generator/3s.scenario.npz -o profile.json [--below 60]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from anetts.mil import load_program  # noqa: E402


def snr_db(ref: torch.Tensor, test: torch.Tensor) -> float:
    r = ref.double()
    sig, err = float((r * r).sum()), float(((test.double() - r) ** 2).sum())
    return round(10 * np.log10(sig / err), 2) if err > 0 and sig > 0 else 200.0


def profile(test_pkg: Path, ref_pkg: Path, scenario_npz: Path) -> list[dict]:
    from anetts.scenario import load_scenario

    inputs = dict(load_scenario(scenario_npz)[0].calls[0].inputs)  # the export's one call
    test = load_program(test_pkg)
    ft = test._fn(None)  # executor internals: this is a debugging tool
    with torch.inference_mode():
        kept = test._execute(ft, test._bind_inputs(ft, inputs), keep_all=True)
    ref = load_program(ref_pkg)
    fr = ref._fn(None)
    env = ref._bind_inputs(fr, inputs)
    rows = []
    with torch.inference_mode():
        for i, step in enumerate(fr.steps):
            args = [env[x] if k == 0 else (x if k == 1 else [env[n] if kk == 0 else n for kk, n in x])
                    for k, x in step.argspec]
            out = step.fn(*args)
            for name, val in zip(step.outs, [out] if len(step.outs) == 1 else list(out)):
                env[name] = val
                other = kept.pop(f"{name}_cast_fp16", None)
                if other is None:
                    other = kept.pop(name, None)
                if (other is not None and isinstance(val, torch.Tensor) and val.is_floating_point()
                        and val.numel() > 1 and other.shape == val.shape):
                    rows.append({"index": i, "op": step.op_type, "var": name, "shape": list(val.shape),
                                 "test_dtype": str(other.dtype).removeprefix("torch."),
                                 "snr_db": snr_db(val, other)})
            for name in step.free:
                del env[name]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("test", type=Path)
    ap.add_argument("reference", type=Path)
    ap.add_argument("inputs", type=Path, help="the export's scenario (.scenario.npz): its one call's inputs")
    ap.add_argument("--below", type=float, default=200.0, help="print only vars below this SNR (dB)")
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    rows = profile(args.test, args.reference, args.inputs)
    for r in rows:
        if r["snr_db"] < args.below:
            print(f"{r['index']:5d} {r['op']:16s} {r['var']:40s} {str(r['shape']):20s} {r['test_dtype']:8s} {r['snr_db']:6.1f}")
    args.output.write_text(json.dumps({"test": str(args.test), "reference": str(args.reference), "rows": rows}, indent=1),
                           encoding="utf-8")
    print(f"wrote {args.output} ({len(rows)} vars)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
