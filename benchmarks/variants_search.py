"""Search per-stage compression settings on built base packages: every trial gated as a variant is.

Each trial compresses one stage's base package (artifacts/<model>/packages/<stage>/<bucket>) with
`anetts.compile.compress.compress_model` (settings through `resolve_settings`, as a config variant
gets them), saves it to a temporary directory, and scores it with `anetts.verify.parity.run_parity`
against the export's eager fp32 outputs under the default gate (35 dB, durations >= 0.95 exact),
exactly as `compress_and_gate` does, without the snakemake DAG (single weights stay uncompressed
through the library's `exclude_op_names`). One exploration-only form builds the coremltools
OptimizationConfig here: `only` (compress just these const tensors; plan sensitivity:<stage>:<preset>).

Screens (rows without package bytes): `--swap <stage>:<preset>` compresses the stage once and swaps
each dequantized weight alone into the base program on the MIL executor (one tensor at a time, no
package per tensor; LSTM weights are packed by the executor's kernel and not screened);
`--kmeans <stage>:<const>,...` runs coremltools' own k-means LUT on single weights and scores the
stage with only that weight replaced by its reconstruction.

    python benchmarks/variants_search.py --model kokoro-82m-onnx --root <scratch copy>/artifacts \
        --plan sweep --swap duration:int8 --kmeans generator:noise_convs_1_weight_to_fp16 \
        [--trial '{"label": "generator:x", "stage": "generator", "settings": {"mode": "linear"}}']

Trials accumulate in the output JSON (one row per label; re-running a label replaces its row),
each with the machine it ran on; `sets` sums the bytes of the full sets in SETS against the model's
fp16 weight bytes (2 x the upstream checkpoint's parameters). `--table` prints what is stored.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from anetts import artifacts  # noqa: E402
from anetts.compile import compress as C  # noqa: E402
from anetts.provenance import provenance  # noqa: E402

BUCKETS = {"duration": "t64", "f0ntrain": "3s", "decoder_pre": "3s", "generator": "3s"}
STAGES = tuple(BUCKETS)
INT8 = {"mode": "linear"}
LUT = {n: {"mode": "palettize", "nbits": n} for n in (4, 6, 8)}


def _paths(root: Path, model: str, stage: str, bucket: str) -> dict:
    mdir = artifacts.model_dir(model, root)
    return {"base": mdir / "packages" / stage / f"{bucket}.mlpackage",
            "base_report": mdir / "packages" / stage / f"{bucket}.json",
            "scenario": artifacts.export_files(model, stage, bucket, root)["scenario"],
            "export_report": artifacts.export_files(model, stage, bucket, root)["report"],
            "parity": mdir / "parity" / stage / f"{bucket}.json"}


def _value_key(v) -> tuple:
    """A const's identity by value (shape and fp32 bytes): the executor's tensors carry no names."""
    import hashlib

    import numpy as np

    a = np.ascontiguousarray(np.asarray(v, dtype=np.float32))
    return (tuple(a.shape), hashlib.sha1(a.tobytes()).hexdigest())


def weight_tensors(package: Path, threshold: int = 2048) -> list[dict]:
    """Const tensors with at least `threshold` elements: name, consumer op type, elements, dtype."""
    from coremltools.converters.mil.frontend.milproto.load import load as milload

    ct = C._ct()
    m = ct.models.MLModel(str(package), skip_model_load=True)
    spec = m.get_spec()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = milload(spec, spec.specificationVersion, m.weights_dir)
    rows = []
    for f in prog.functions.values():
        for op in f.find_ops(op_type="const"):
            v = op.outputs[0].val
            if isinstance(getattr(v, "size", None), int) and v.size >= threshold:
                kids = op.outputs[0].child_ops
                rows.append({"name": op.name, "key": _value_key(v), "consumer": kids[0].op_type if kids else None,
                             "consumer_name": kids[0].name if kids else None,
                             "consumer_out": kids[0].outputs[0].name if kids else None,
                             "uses": sorted({n for c in kids for n in (c.name, c.outputs[0].name)}),
                             "elements": int(v.size), "dtype": str(v.dtype), "shape": list(v.shape)})
    return rows


def _compress(base: Path, settings: dict, only: list[str] | None):
    if only is None:
        return C.compress_model(base, settings, "search")[0]
    from coremltools.optimize import coreml as cto

    ct = C._ct()
    mlmodel = ct.models.MLModel(str(base), skip_model_load=True)
    names = {r["name"] for r in weight_tensors(base, 0)}
    unknown = sorted(set(only) - names)
    if unknown:
        raise C.CompressionError(f"no const tensor named {unknown} in {base}")
    config = cto.OptimizationConfig(global_config=None, op_name_configs={n: C.op_config(settings) for n in only})
    fn = cto.linear_quantize_weights if settings["mode"] == "linear" else cto.palettize_weights
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(mlmodel, config)


def _one_call(p: dict):
    """(function, inputs, expected outputs, valid regions) of a one-call export."""
    from anetts.scenario import load_scenario
    from anetts.tensors import FunctionSpec

    spec = FunctionSpec.from_json(json.loads(Path(p["export_report"]).read_text())["functions"][0])
    scenario, expected = load_scenario(p["scenario"])
    (call,) = scenario.calls
    return spec, dict(call.inputs), expected[0], dict(call.valid)


def run_trial(root: Path, model: str, trial: dict) -> dict:
    from anetts.compile.reproducible import stabilize_package
    from anetts.options import Gate
    from anetts.verify.parity import run_parity

    stage = trial["stage"]
    bucket = trial.get("bucket", BUCKETS[stage])
    p = _paths(root, model, stage, bucket)
    settings = C.resolve_settings(trial["settings"], f"trial {trial['label']}")
    gate = Gate.make(min_snr_db=35, min_exact_fraction=0.95)
    t0 = time.perf_counter()
    mlmodel = _compress(p["base"], settings, trial.get("only"))
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="variants_search_") as tmp:
        pkg = Path(tmp) / f"{bucket}.mlpackage"
        mlmodel.save(str(pkg))
        stabilize_package(pkg)
        report = run_parity(pkg, p["scenario"], p["export_report"], gate)
        nbytes, wbytes = artifacts.tree_bytes(pkg), artifacts.weight_file_bytes(pkg)
    mil = report["backends"]["mil"]
    base_bytes = artifacts.tree_bytes(p["base"])
    base_parity = json.loads(p["parity"].read_text())["backends"]["mil"]["min_snr_db"] if p["parity"].exists() else None
    return {
        "label": trial["label"], "stage": stage, "bucket": bucket, "settings": settings,
        **({"only": trial["only"]} if trial.get("only") is not None else {}),
        "min_snr_db": None if mil["min_snr_db"] is None else round(mil["min_snr_db"], 3),
        "snr_db": {o: round(m["snr_db"], 3) for o, m in mil["outputs"].items() if "snr_db" in m},
        "exact_fraction": {o: m["exact_fraction"] for o, m in mil["outputs"].items() if "exact_fraction" in m} or None,
        "passed": bool(mil["passed"]), "base_min_snr_db": base_parity,
        "bytes": nbytes, "weight_bytes": wbytes, "base_bytes": base_bytes,
        "size_ratio": round(nbytes / base_bytes, 4),
        "seconds": {"compress": round(t1 - t0, 2), "total": round(time.perf_counter() - t0, 2)},
    }


def swap_sensitivity(root: Path, model: str, stage: str, preset: str) -> list[dict]:
    """One tensor at a time, fast: the stage compressed whole once (library path), both programs loaded
    on the MIL executor, and each compressed (dequantized) weight swapped alone into the base program.

    The same weights as a one-tensor package (coremltools compresses each const independently), without
    a save / load per tensor; a screen only: rows carry no package bytes, the chosen set is re-run as a
    package trial.
    """
    import torch

    from anetts.gate import score as _score
    from anetts.mil import load_program
    from anetts.options import Gate

    bucket = BUCKETS[stage]
    p = _paths(root, model, stage, bucket)
    settings = C.resolve_settings(INT8 if preset == "int8" else LUT[int(preset.removeprefix("lut"))], "sensitivity")
    spec, inputs, reference, regions = _one_call(p)
    gate = Gate.make(min_snr_db=35, min_exact_fraction=0.95)
    base = load_program(p["base"])
    with tempfile.TemporaryDirectory(prefix="variants_search_") as tmp:
        pkg = Path(tmp) / f"{bucket}.mlpackage"
        C.compress_model(p["base"], settings, "sensitivity")[0].save(str(pkg))
        comp = load_program(pkg)

    def score(prog):
        return _score(spec, prog.run(inputs), reference, regions, gate)

    whole = score(comp)
    # the executor names a step by its op's first output (`var_N`), coremltools' configs by op name (`op_N`)
    by_key = {t["key"]: t for t in weight_tensors(p["base"])}
    fb, fc = base._fn(None), comp._fn(None)
    csteps = {s.op_name: s for s in fc.steps}
    # a weight used by several ops (ALBERT's shared layers) is swapped in all of them at once
    groups: dict[int, list] = {}
    for step in fb.steps:
        other = csteps.get(step.op_name)
        if other is None:
            continue
        for i, ((_, v), (_, v2)) in enumerate(zip(step.argspec, other.argspec)):
            if isinstance(v, torch.Tensor) and isinstance(v2, torch.Tensor) and v.shape == v2.shape \
                    and not torch.equal(v, v2):
                t = by_key.get(_value_key(v.numpy()))
                groups.setdefault(t["name"] if t else id(v), []).append((step, i, other.argspec[i], t))
    rows = []
    for uses in groups.values():
        t = uses[0][3] or {"name": f"{uses[0][0].op_name}:arg{uses[0][1]}", "consumer": uses[0][0].op_type,
                           "elements": int(uses[0][2][1].numel())}
        saved = [(s, s.argspec) for s, *_ in uses]
        for s, i, v2, _ in uses:
            s.argspec = tuple(v2 if j == i else a for j, a in enumerate(s.argspec))
        r = score(base)
        for s, a in saved:
            s.argspec = a
        rows.append({"label": f"{stage}:{preset}:swap:{t['name']}", "stage": stage, "bucket": bucket,
                     "settings": settings, "method": "swap", "only": [t["name"]], "consumer": t["consumer"],
                     "uses": len(uses), "elements": t["elements"], "min_snr_db": round(r["min_snr_db"], 3),
                     "snr_db": {o: round(m["snr_db"], 3) for o, m in r["outputs"].items() if "snr_db" in m},
                     "exact_fraction": {o: m["exact_fraction"] for o, m in r["outputs"].items()
                                        if "exact_fraction" in m} or None,
                     "passed": r["passed"], "whole_stage_min_snr_db": round(whole["min_snr_db"], 3),
                     "bytes": None, "size_ratio": None})
        print(f"{t['name'][:60]:60s} {t['consumer']:15s} x{len(uses):<3d} {t['elements']:9d} "
              f"{r['min_snr_db']:8.2f} dB", flush=True)
    return rows


def kmeans_check(root: Path, model: str, stage: str, names: list[str], nbits: int = 8) -> list[dict]:
    """coremltools' own k-means LUT (the function palettize_weights calls) on single weights: how many
    elements its LUT + indices get wrong. Tensors under 10,000 elements, fp32 tensors, and every tensor
    when the optional kmeans1d package is absent go to scikit-learn KMeans with min(elements, 2^nbits)
    clusters, even when the tensor has fewer distinct values than that."""
    import numpy as np
    from coremltools.converters.mil.frontend.milproto.load import load as milload
    from coremltools.models.neural_network.quantization_utils import _get_kmeans_lookup_table_and_weight

    import torch

    from anetts.gate import score as _score
    from anetts.mil import load_program
    from anetts.options import Gate

    ct = C._ct()
    p = _paths(root, model, stage, BUCKETS[stage])
    base = p["base"]
    spec_, inputs, reference, regions = _one_call(p)
    gate = Gate.make(min_snr_db=35, min_exact_fraction=0.95)
    prog_x = load_program(base)
    steps = prog_x._fn(None).steps
    m = ct.models.MLModel(str(base), skip_model_load=True)
    spec = m.get_spec()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = milload(spec, spec.specificationVersion, m.weights_dir)
        consts = {op.name: op.outputs[0].val for f in prog.functions.values() for op in f.find_ops(op_type="const")}
        rows = []
        for n in names:
            w = consts[n]
            lut, idx = _get_kmeans_lookup_table_and_weight(nbits, w)
            deq = lut.reshape(-1)[np.asarray(idx).reshape(-1)].reshape(w.shape)
            err = np.abs(deq - w.astype(np.float64))
            # the stage with only this weight replaced by its LUT reconstruction (every use of it)
            key, saved = _value_key(w), []
            for st in steps:
                for i, (k, v) in enumerate(st.argspec):
                    if isinstance(v, torch.Tensor) and tuple(v.shape) == tuple(w.shape) and _value_key(v.numpy()) == key:
                        saved.append((st, st.argspec))
                        new = torch.from_numpy(deq.astype(np.float32)).to(v.dtype)
                        st.argspec = tuple((k, new) if j == i else a for j, a in enumerate(st.argspec))
            r = _score(spec_, prog_x.run(inputs), reference, regions, gate) if saved else None
            for st, a in reversed(saved):
                st.argspec = a
            rows.append({"label": f"{stage}:kmeans{nbits}:{n}", "stage": stage, "method": "kmeans", "name": n,
                         "dtype": str(w.dtype), "shape": list(w.shape), "distinct_values": int(np.unique(w).size),
                         "max_abs_weight": float(np.abs(w).max()), "max_abs_error": float(err.max()),
                         "elements_off_by_1e-3": int((err > 1e-3).sum()), "swapped_uses": len(saved),
                         "min_snr_db": None if r is None else round(r["min_snr_db"], 3),
                         "passed": None if r is None else r["passed"],
                         "bytes": None, "size_ratio": None})
            print(f"{n:50s} {str(w.dtype):8s} {w.size:9d} distinct {np.unique(w).size:6d} max err {err.max():.4g} "
                  f"(max |w| {np.abs(w).max():.3g}), {(err > 1e-3).sum()} elements off by > 1e-3; stage with it alone: "
                  f"{'-' if r is None else round(r['min_snr_db'], 2)} dB", flush=True)
    return rows


def end_to_end(root: Path, model: str, variant: str, combos: list[str]) -> dict:
    """The model's end-to-end check (config `models.<model>.end_to_end`: texts, gate) on a built variant
    (`snakemake artifacts/<model>/variants/<variant>/manifest.json`) with only the stages of each
    combination ("duration+generator", "all", "none") compressed, the others back on their base packages."""
    import dataclasses

    import yaml

    import anetts
    from anetts.models.kokoro.end_to_end import check_end_to_end

    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    fam = cfg["families"]["kokoro"]["end_to_end"]
    e2e = {**fam, **cfg["models"][model].get("end_to_end", {})}
    gate = {**fam["gate"], **cfg["models"][model].get("end_to_end", {}).get("gate", {})}
    params = {"texts": e2e["texts"], "seed": e2e.get("seed", 0)}
    mdir = artifacts.model_dir(model, root)
    out = {}
    for combo in combos:
        tts = anetts.load(mdir / "variants" / variant, backend="mil")
        pk = tts.artifacts.packages
        every = sorted({e.stage for e in pk.values()})
        stages = [] if combo == "none" else every if combo == "all" else combo.split("+")
        for k, e in list(pk.items()):
            if e.stage not in stages:
                base = mdir / "packages" / e.stage / Path(e.path).name
                pk[k] = dataclasses.replace(e, path=base, sha256=json.loads(base.with_suffix(".json").read_text())["sha256"])
        r = check_end_to_end(tts, mdir / "weights", params, gate)
        out[combo] = {"compressed": stages, "passed": r["passed"], "checks": r["checks"], "worst": r["worst"],
                      "waveform_snr_db": [t["waveform_snr_db"] for t in r["texts"]], "gate": gate}
        print(f"end-to-end {variant} [{combo}]: {'pass' if r['passed'] else 'FAIL'}, waveform "
              f"{out[combo]['waveform_snr_db']} dB, log-mel gap {r['worst']['log_mel_corr_gap']:.5f}", flush=True)
    return out


def plan(name: str, root: Path, model: str) -> list[dict]:
    """The trials of a named plan."""
    if name == "sweep":  # the stock settings per stage, then the variations tried on the failing stages
        T = lambda stage, key, settings, **kw: {"label": f"{stage}:{key}", "stage": stage, "settings": settings, **kw}
        thr = {"weight_threshold": 4096}  # above noise_convs_1 (2816 elements: k-means fails on it)
        albert = ["conv_6_weight_0", "conv_3_weight_0", "conv_4_weight_0", "conv_5_weight_0"]  # the screen's worst four
        return [
            T("generator", "int8", INT8), T("generator", "lut8", LUT[8]), T("generator", "lut6", LUT[6]),
            T("generator", "int8-no-conv_transpose", {**INT8, "exclude_op_types": ["conv_transpose"]}),
            T("generator", "int8-asym", {**INT8, "symmetric": False}),
            T("generator", "uint8-asym", {**INT8, "dtype": "uint8", "symmetric": False}),
            T("generator", "int8-per_tensor", {**INT8, "granularity": "per_tensor"}),
            T("generator", "int8-thr65537", {**INT8, "weight_threshold": 65537}),
            T("generator", "int8-thr200000", {**INT8, "weight_threshold": 200000}),
            T("generator", "lut8-uniform", {**LUT[8], "algorithm": "uniform"}),
            T("generator", "lut8-thr4096", {**LUT[8], **thr}),
            T("generator", "lut8-ex-noise_convs_1", {**LUT[8], "exclude_op_names": ["noise_convs_1_weight_to_fp16"]}),
            T("generator", "lut6-thr4096", {**LUT[6], **thr}),
            T("duration", "int8", INT8),
            T("duration", "int8-asym", {**INT8, "symmetric": False}),
            T("duration", "int8-asym-per_tensor", {**INT8, "symmetric": False, "granularity": "per_tensor"}),
            T("duration", "int8-no-lstm", {**INT8, "exclude_op_types": ["lstm"]}),
            T("duration", "int8-ex-albert2", {**INT8, "exclude_op_names": albert[:2]}),
            T("duration", "int8-ex-albert3", {**INT8, "exclude_op_names": albert[:3]}),
            T("duration", "int8-ex-albert4", {**INT8, "exclude_op_names": albert}),
            # f0ntrain's (fp32) LUTs: scikit-learn k-means on every fp32 tensor takes minutes here; its
            # LUT8/6 (62.7 / 44.6 dB) are in benchmarks/results/variants_kokoro-82m-onnx.json
            T("f0ntrain", "int8", INT8),
            T("decoder_pre", "int8", INT8), T("decoder_pre", "lut8", LUT[8]), T("decoder_pre", "lut6", LUT[6]),
        ]
    if name.startswith("sensitivity:"):  # one tensor at a time, e.g. sensitivity:generator:int8
        _, stage, preset = name.split(":")
        settings = INT8 if preset == "int8" else LUT[int(preset.removeprefix("lut"))]
        tensors = weight_tensors(_paths(root, model, stage, BUCKETS[stage])["base"])
        return [{"label": f"{stage}:{preset}:only:{t['name']}", "stage": stage, "settings": settings,
                 "only": [t["name"]], "elements": t["elements"], "consumer": t["consumer"]} for t in tensors]
    raise SystemExit(f"unknown plan {name!r}: sweep | sensitivity:<stage>:<int8|lut8|lut6|lut4>")


# full sets (one trial label per stage): their bytes against the model's fp16 weight bytes
SETS = {
    "smallest-passing": ["duration:int8-ex-albert2", "f0ntrain:int8", "decoder_pre:lut6", "generator:lut8-thr4096"],
    "margin": ["duration:int8-ex-albert2", "f0ntrain:int8", "decoder_pre:lut8", "generator:lut8-thr4096"],
}


def fp16_weight_bytes(root: Path, model: str) -> int:
    """2 bytes per parameter of the upstream checkpoint the build converted."""
    import torch

    ckpt = artifacts.model_dir(model, root) / "weights" / "kokoro-v1_0.pth"
    sd = torch.load(ckpt, map_location="cpu", weights_only=True)
    return 2 * sum(t.numel() for part in sd.values() for t in part.values())


def summarize_sets(rows: dict, fp16_bytes: int) -> dict:
    out = {}
    for name, labels in SETS.items():
        got = [rows[lb] for lb in labels if lb in rows]
        if len(got) != len(labels):
            continue
        total = sum(r["bytes"] for r in got)
        out[name] = {"trials": labels, "bytes": total, "fp16_weight_bytes": fp16_bytes,
                     "ratio_vs_fp16_weights": round(total / fp16_bytes, 4),
                     "min_snr_db": min(r["min_snr_db"] for r in got), "all_passed": all(r["passed"] for r in got)}
    return out


def table(rows: list[dict]) -> str:
    lines = [f"{'label':78s} {'dB':>8s} {'exact':>6s} {'ratio':>6s} {'MB':>7s} pass"]
    rows = [r for r in rows if r.get("method") != "swap"] + [r for r in rows if r.get("method") == "swap"]
    for r in rows:
        ex = ",".join(f"{v:.2f}" for v in (r.get("exact_fraction") or {}).values()) or "-"
        if r.get("method") == "kmeans":
            lines.append(f"{r['label'][:78]:78s} k-means max err {r['max_abs_error']:.3g} of max |w| "
                         f"{r['max_abs_weight']:.3g}, {r['distinct_values']} distinct values; alone: "
                         f"{r['min_snr_db']} dB")
            continue
        db = "-" if r["min_snr_db"] is None else f"{r['min_snr_db']:.2f}"
        ratio = "-" if r.get("size_ratio") is None else f"{r['size_ratio']:.3f}"
        mb = "-" if r.get("bytes") is None else f"{r['bytes'] / 1e6:.2f}"
        lines.append(f"{r['label'][:78]:78s} {db:>8s} {ex:>6s} {ratio:>6s} {mb:>7s} "
                     f"{'yes' if r['passed'] else 'no'}")
    return "\n".join(lines)


def _save(out: Path, model: str, rows: dict, prov: dict) -> None:
    """Write the rows, merged over what another run may have stored meanwhile (ours win)."""
    doc = json.loads(out.read_text()) if out.exists() else {}
    merged = {r["label"]: r for r in doc.get("rows", [])}
    merged.update(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc.update({"model": model, "rows": list(merged.values()), "provenance": prov})
    out.write_text(json.dumps(doc, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="kokoro-82m-onnx")
    ap.add_argument("--root", type=Path, default=REPO / "artifacts", help="the artifacts directory of the build")
    ap.add_argument("--plan", action="append", default=[], help="sweep | sensitivity:<stage>:<preset>")
    ap.add_argument("--swap", action="append", default=[], help="<stage>:<preset>: swap_sensitivity screen")
    ap.add_argument("--kmeans", action="append", default=[], help="<stage>:<const>[,<const>...]: kmeans_check")
    ap.add_argument("--end-to-end", nargs="+", metavar=("VARIANT", "STAGES"),
                    help="a built variant, then stage combinations to run end to end (a+b, or none)")
    ap.add_argument("--trial", action="append", default=[], help="one trial as JSON: label, stage, settings[, only]")
    ap.add_argument("--skip-done", action="store_true", help="skip labels already in the output")
    ap.add_argument("--table", action="store_true", help="print the stored rows and exit")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    out = args.output or REPO / "benchmarks" / "results" / f"variants_search_{args.model}.json"
    doc = json.loads(out.read_text()) if out.exists() else {"model": args.model, "rows": []}
    rows = {r["label"]: r for r in doc["rows"]}
    if args.table:
        print(table(list(rows.values())))
        for name, st in doc.get("sets", {}).items():
            print(f"set {name}: {st['bytes'] / 1e6:.2f} MB = {st['ratio_vs_fp16_weights']:.3f} x fp16 weights "
                  f"({st['fp16_weight_bytes'] / 1e6:.2f} MB), min {st['min_snr_db']:.2f} dB, passed {st['all_passed']}")
        return
    trials = [t for name in args.plan for t in plan(name, args.root, args.model)] + [json.loads(t) for t in args.trial]
    prov = provenance()
    mine: dict = {}
    if args.end_to_end:
        res = end_to_end(args.root, args.model, args.end_to_end[0], args.end_to_end[1:] or ["all"])
        doc = json.loads(out.read_text()) if out.exists() else {"model": args.model, "rows": []}
        doc.setdefault("end_to_end", {})[args.end_to_end[0]] = {**doc.get("end_to_end", {}).get(args.end_to_end[0], {}),
                                                                 **res, "machine": prov["machine"]}
        out.write_text(json.dumps(doc, indent=1) + "\n")
    for spec_ in args.kmeans:
        stage, names = spec_.split(":")
        for r in kmeans_check(args.root, args.model, stage, names.split(",")):
            r["machine"] = prov["machine"]
            mine[r["label"]] = rows[r["label"]] = r
        _save(out, args.model, mine, prov)
    for name in args.swap:
        stage, preset = name.split(":")
        for r in swap_sensitivity(args.root, args.model, stage, preset):
            r["machine"] = prov["machine"]
            mine[r["label"]] = rows[r["label"]] = r
        _save(out, args.model, mine, prov)
    for t in trials:
        if args.skip_done and t["label"] in rows:
            continue
        r = run_trial(args.root, args.model, t)
        r.update({k: t[k] for k in ("elements", "consumer", "note") if k in t})
        r["machine"] = prov["machine"]
        mine[t["label"]] = rows[t["label"]] = r
        print(table([r]).splitlines()[1], flush=True)
        _save(out, args.model, mine, prov)
    doc = json.loads(out.read_text()) if out.exists() else {"model": args.model, "rows": []}
    doc.setdefault("rows", [])
    doc["sets"] = summarize_sets({r["label"]: r for r in doc["rows"]}, fp16_weight_bytes(args.root, args.model))
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(doc["rows"]))
    for name, st in doc["sets"].items():
        print(f"set {name}: {st['bytes'] / 1e6:.2f} MB = {st['ratio_vs_fp16_weights']:.3f} x fp16 weights "
              f"({st['fp16_weight_bytes'] / 1e6:.2f} MB), min {st['min_snr_db']:.2f} dB, passed {st['all_passed']}")


if __name__ == "__main__":
    main()
