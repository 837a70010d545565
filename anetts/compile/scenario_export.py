"""Rule `export` for every stage kind (`export_bucket`), and the export of a scenario stage: one
TorchScript per function, and the teacher-forced scenario parity plays.

The layout is every stage's (`anetts.compile.trace`, `write_export`):
    <bucket>.functions/<function>.pt  TorchScript of each function (one module, traced per input shape)
    <bucket>.scenario.npz             the teacher-forced calls (inputs, valid regions) and per call
                                      upstream's outputs plus the eager wrapper's states
    <bucket>.export.json              functions, geometry, eager-vs-upstream and trace-vs-eager
                                      errors, the positions checked, timings, provenance

A scenario stage's expected outputs are upstream's own tensors (the shared reference run), not the
wrapper's: the wrapper is checked against them here at fp32 (`EAGER_MIN_DB`), the package against
them in parity.
"""
from __future__ import annotations

import copy
import logging
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from anetts.artifacts import atomic_outputs, clear_outputs, write_json
from anetts.compile.trace import (TRACE_REL_TOL, ExportError, export_stage, load_reference, trace_with_outputs,
                                  write_export)
from anetts.families import declaration
from anetts.provenance import provenance
from anetts.stage import Family
from anetts.verify.metrics import compare, logit_rows, top1_agreement
from anetts.verify.parity import valid_part
from anetts.verify.scenario import record_eager

log = logging.getLogger(__name__)

# The fp32 wrapper and fp32 upstream do the same math in another op order; below this SNR on any
# call the wrapper is wrong (a RoPE layout, a mask, a missing norm), not rounded.
EAGER_MIN_DB = 70.0


def _positions(scenario) -> list[int]:
    return [int(c.inputs["pos"][0]) if "pos" in c.inputs else i for i, c in enumerate(scenario.calls)]


def _trace(module, fn, inputs: dict) -> tuple[torch.jit.ScriptModule, dict]:
    """Trace `fn` on one of its calls' inputs from zeroed states; check the trace against eager."""
    args = tuple(torch.from_numpy(np.ascontiguousarray(inputs[t.name])) for t in fn.inputs)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # forward writes the state buffers: the recording pass and the replay each on a fresh copy
        traced, eager = trace_with_outputs(copy.deepcopy(module), args)
        replay = traced(*args)
    replay = replay if isinstance(replay, tuple) else (replay,)
    errors = {}
    for t, e, r in zip(fn.outputs, eager, replay):
        max_abs = float((e.double() - r.double()).abs().max())
        scale = float(e.double().abs().max()) or 1.0
        errors[t.name] = {"max_abs": max_abs, "ref_absmax": scale}
        if not np.isfinite(max_abs) or max_abs > TRACE_REL_TOL * scale:
            raise ExportError(f"{fn.name}: traced output {t.name} differs from eager by {max_abs:.3g}")
    return traced, errors


def synthetic_inputs(fn, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs to trace `fn` on when no scenario gives them: standard normal floats, zero ints
    (positions 0)."""
    rng = np.random.default_rng(seed)
    return {t.name: np.zeros(t.shape, np.int32) if t.dtype == "int32" else rng.standard_normal(t.shape).astype(np.float32)
            for t in fn.inputs}


def compile_module(module, functions, out_dir: Path, options, model_meta: dict, stage: str,
                   geometry: dict | None = None) -> tuple[Path, dict]:
    """`module`'s functions traced (checked against eager, on `synthetic_inputs`), converted and
    merged into `out_dir/<stage>.mlpackage`: rules export + convert of a scenario stage in one call, for
    tests and benchmarks. Returns (package, {function: convert report, with its trace seconds},
    plus "bundle_seconds")."""
    from anetts.compile.convert import convert_functions

    out_dir, functions = Path(out_dir), list(functions)
    out_dir.mkdir(parents=True, exist_ok=True)
    torchscripts, trace_s = {}, {}
    for fn in functions:
        t0 = time.perf_counter()
        traced, _ = _trace(module, fn, synthetic_inputs(fn))
        torchscripts[fn.name] = out_dir / f"{stage}.{fn.name}.pt"
        torch.jit.save(traced, str(torchscripts[fn.name]))
        trace_s[fn.name] = round(time.perf_counter() - t0, 3)
    work = out_dir / f"{stage}.functions"
    work.mkdir(exist_ok=True)
    out = out_dir / f"{stage}.mlpackage"
    bundle, reports = convert_functions(torchscripts, functions, out, work, options, model_meta, stage, geometry)
    for name, r in reports.items():
        r["seconds"]["trace"] = trace_s[name]
    # beside the package, as the DAG's convert report: its typed functions (what a runner loads)
    write_json(out.with_suffix(".json"), {"stage": stage, "default_function": functions[0].name,
                                          "functions": [f.to_json() for f in functions]})
    return out, {**reports, "bundle_seconds": bundle["seconds"]}


def export_bucket(family: Family, stage_name: str, bucket: str, size: int, params: dict, weights_dir: Path,
                  reference: Path | None, out_functions: Path, out_scenario: Path, out_json: Path) -> dict:
    """Rule `export`: the stage at one bucket in the one layout. The family's declaration says how
    it is verified: a stateless stage by one call on its example inputs (`export_stage`), a
    scenario stage by upstream's teacher-forced calls (`export_scenario_stage`)."""
    if declaration(family.name).stage(stage_name).kind == "scenario":
        return export_scenario_stage(family, stage_name, bucket, size, params, weights_dir, reference,
                                     out_functions, out_scenario, out_json)
    return export_stage(family, stage_name, size, weights_dir, out_functions, out_scenario, out_json,
                        reference=reference)


def export_scenario_stage(family: Family, stage_name: str, bucket: str, size: int, params: dict, weights_dir: Path,
                          reference: Path, out_functions: Path, out_scenario: Path, out_json: Path) -> dict:
    out_functions, out_scenario, out_json = Path(out_functions), Path(out_scenario), Path(out_json)
    clear_outputs(out_functions, out_scenario, out_json)
    t0 = time.perf_counter()
    stage = family.stage(stage_name, params, weights_dir)
    functions = stage.functions(size)
    model = stage.load(weights_dir, size)
    module = stage.build(model).eval()
    scenario, upstream = stage.scenario(model, size, load_reference(reference))
    t1 = time.perf_counter()
    eager = record_eager(copy.deepcopy(module), scenario)
    t2 = time.perf_counter()

    # the wrapper vs upstream, every call (the package is later scored against upstream alone)
    worst, per_output = {}, {}
    for i, (e, u) in enumerate(zip(eager, upstream)):
        valid = scenario.calls[i].valid
        for name, want in u.items():
            got, ref = valid_part(e[name], valid.get(name)), valid_part(want, valid.get(name))
            db = compare(ref, got)["snr_db"]
            worst[name] = min(worst.get(name, np.inf), db)
            per_output.setdefault(name, []).append(round(float(db), 2))
    bad = {k: v for k, v in worst.items() if not v >= EAGER_MIN_DB}
    if bad:
        raise ExportError(f"{stage_name}/{stage.name}: the eager wrapper differs from upstream (worst dB per output "
                          f"{ {k: round(float(v), 1) for k, v in bad.items()} }, need >= {EAGER_MIN_DB})")
    top1 = {}
    for name in stage.logits_outputs():  # over each call's valid rows (a padded prefill block's are not)
        calls = [i for i, u in enumerate(upstream) if name in u]
        regions = [scenario.calls[i].valid.get(name) for i in calls]
        top1[name] = top1_agreement(logit_rows(valid_part(upstream[i][name], r) for i, r in zip(calls, regions)),
                                    logit_rows(valid_part(eager[i][name], r) for i, r in zip(calls, regions)))

    expected = [{**{k: v for k, v in e.items() if k.startswith("state/")}, **u} for e, u in zip(eager, upstream)]
    first_call = {}
    for c in scenario.calls:
        first_call.setdefault(c.function, c.inputs)
    t3 = time.perf_counter()
    traced, trace_errors = {}, {}
    for fn in functions:
        if fn.name not in first_call:
            raise ExportError(f"{stage_name}: the scenario never calls function {fn.name!r}; parity could not check it")
        traced[fn.name], trace_errors[fn.name] = _trace(module, fn, first_call[fn.name])
    t4 = time.perf_counter()

    positions = _positions(scenario)
    report = {
        "kind": "scenario",
        "stage": stage_name,
        "bucket": bucket,
        "size": size,
        "description": stage.description,
        "functions": [f.to_json() for f in functions],
        "default_function": functions[0].name,
        "geometry": stage.geometry(size),
        "scenario": scenario.name,
        "calls": len(scenario.calls),
        "calls_per_function": {f.name: sum(c.function == f.name for c in scenario.calls) for f in functions},
        "positions_checked": [min(positions), max(positions)],
        "logits_outputs": list(stage.logits_outputs()),
        "uncompressed_weights": list(stage.uncompressed_weights()),
        "eager_vs_upstream": {"min_snr_db": {k: round(float(v), 2) for k, v in worst.items()},
                              "per_call_db": per_output, "top1": top1, "gate_db": EAGER_MIN_DB},
        "trace_vs_eager": trace_errors,
        "seconds": {"prepare": round(t1 - t0, 3), "eager_scenario": round(t2 - t1, 3), "trace": round(t4 - t3, 3)},
        "provenance": provenance(),
    }
    return write_export(report, traced, scenario, expected, out_functions, out_scenario, out_json)
