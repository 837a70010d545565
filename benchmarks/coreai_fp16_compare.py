"""The same fp16 model under three executors, per stage, and the single-op probe that explains the gap.

Per stage (first configured bucket of a built workflow): worst-output SNR on the valid region vs
the export's eager fp32 outputs for
  mil                    the pipeline's fp16 `.mlpackage` run by anetts.mil (fp32 accumulation),
  coreai                 the Core AI fp16 asset run by Apple's runtime,
  torch_fp16             the wrapper in half precision, torch eager on CPU,
  torch_fp16_decomposed  Core AI's decomposed program in half precision, run by torch,
  torch_fp16_decomposed_fp16acc  the same with its matrix products accumulated in fp16,
  torch_fp16_decomposed_fp16acc_convt  and its 1-D transposed convolutions too.
Stages whose package is not fp16 (duration is fp32 in config.yaml) get a fresh coremltools fp16
conversion for the `mil` column.

    python benchmarks/coreai_fp16_compare.py --workdir /path/to/built/workflow --model kokoro-tiny \
        --ops -o coreai_fp16_compare.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from anetts import artifacts  # noqa: E402
from anetts.families import get_family  # noqa: E402
from anetts.provenance import provenance  # noqa: E402
from anetts.scenario import load_scenario  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks" / "lib"))
from fp16_compare import compare_executors, op_probe, _snr  # noqa: E402

# ops whose fp16 reductions Apple's Linux runtime accumulates in fp16 (see the op probe)
FP16_ACCUMULATED = ("linear", "matmul", "conv_transpose", "lstm")


EXECUTORS = ("mil", "coreai", "torch_fp16", "torch_fp16_decomposed", "torch_fp16_decomposed_fp16acc",
             "torch_fp16_decomposed_fp16acc_convt")


def stage_row(workdir: Path, model_name: str, family, stage_name: str, bucket: str, size: int, model,
              executors=EXECUTORS) -> dict:
    root = workdir / "artifacts"
    stage = family.stage(stage_name)
    spec = stage.function(size)
    scenario, expected = load_scenario(artifacts.export_files(model_name, stage_name, bucket, root)["scenario"])
    inputs, eager = dict(scenario.calls[0].inputs), expected[0]
    reference = tuple(eager[t.name] for t in spec.outputs)
    regions = stage.valid_regions(inputs)
    wrapper = stage.build(model).eval()
    args = tuple(torch.from_numpy(inputs[t.name]) for t in spec.inputs)
    package = artifacts.package_path(model_name, stage_name, bucket, root)
    report = json.loads(artifacts.package_report(model_name, stage_name, bucket, root).read_text())
    use_package = report["precision"] == "fp16"
    run_mil_on_package = use_package and "mil" in executors
    res = compare_executors(wrapper, args, spec, reference, regions,
                            executors=[e for e in executors if not (run_mil_on_package and e == "mil")])
    if run_mil_on_package:
        from anetts.mil import load_program

        t0 = time.perf_counter()
        out = load_program(package).run(inputs)
        per = {}
        for t, r in zip(spec.outputs, reference):
            if t.dtype == "int32":
                continue
            reg = regions.get(t.name)
            cut = (lambda a: a) if reg is None else (lambda a, reg=reg: np.take(a, np.arange(reg[1]), axis=reg[0]))
            per[t.name] = _snr(cut(r), cut(np.asarray(out[t.name]).reshape(r.shape)))
        res["mil"] = {"snr_db": per, "worst_snr_db": min(per.values()),
                      "seconds": round(time.perf_counter() - t0, 2), "program": "pipeline package"}
    elif "mil" in res:
        res["mil"]["program"] = "fresh coremltools fp16 conversion (the pipeline package is fp32)"
    ops = report.get("ops", {})
    hist = next(iter(ops.values())) if ops else {}
    res["fp16_accumulated_ops_in_package"] = {k: v for k, v in hist.items() if any(k.startswith(p) for p in FP16_ACCUMULATED)}
    return {"stage": stage_name, "bucket": bucket, **res}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, required=True, help="a workflow copy whose artifacts/<model> has exports and packages")
    ap.add_argument("--model", default="kokoro-tiny")
    ap.add_argument("--stages", nargs="*", default=None)
    ap.add_argument("--ops", action="store_true", help="also run the single-op probe")
    ap.add_argument("--executors", nargs="*", default=list(EXECUTORS), choices=EXECUTORS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-o", "--out", type=Path, default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    import yaml

    cfg = yaml.safe_load((a.workdir / "config.yaml").read_text())
    fam_name = cfg["models"][a.model]["family"]
    family = get_family(fam_name)
    model = family.load_reference_model(artifacts.weights_dir(a.model, a.workdir / "artifacts"))
    rows = []
    for stage_name, st in cfg["families"][fam_name]["stages"].items():
        if a.stages and stage_name not in a.stages:
            continue
        size = st["buckets"][0]
        bucket = family.stage(stage_name).bucket_name(size)
        row = stage_row(a.workdir, a.model, family, stage_name, bucket, size, model, tuple(a.executors))
        rows.append(row)
        print(json.dumps({k: (v.get("worst_snr_db", v.get("error")) if isinstance(v, dict) and k in
                              EXECUTORS else v)
                          for k, v in row.items()}), flush=True)
    op_rows = []
    if a.ops:
        op_rows = op_probe()
        for r in op_rows:
            print(json.dumps(r, ensure_ascii=False), flush=True)

    cols = tuple(a.executors)
    print("\n| stage / bucket | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    for r in rows:
        cells = [f"{r[c]['worst_snr_db']:.1f}" if "worst_snr_db" in r.get(c, {}) else "error" for c in cols]
        print(f"| {r['stage']} {r['bucket']} | " + " | ".join(cells) + " |")
    if a.out:
        a.out.write_text(json.dumps({"model": a.model, "stages": rows, "ops": op_rows, "provenance": provenance()},
                                    indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
