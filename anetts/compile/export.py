"""Rule `export`: one stage at one bucket traced, checked, and written with the scenario parity plays.

The layout (`anetts.artifacts.export_files`, written by `write_export` atomically, nothing left
behind on failure):
    <bucket>.functions/<function>.pt  TorchScript of each function (one module, traced per input shape)
    <bucket>.scenario.npz             the stage's scenario (`anetts.scenario.save_scenario`): its calls
                                      and per call the outputs expected
    <bucket>.export.json              functions, geometry, the torch figure, trace-vs-eager errors,
                                      the positions checked, timings, provenance

Every stage goes the same way: load, build, its scenario, each function traced on its first call's
inputs and checked against eager. The expected outputs are upstream's where the stage's scenario
gives them (Fish's AR stages: the wrapper is checked against them here at fp32, `EAGER_MIN_DB`);
otherwise the eager wrapper's, recorded while it is traced (a one-call stage, whose example inputs
are its own). The torch figure parity reports is computed here: traced vs eager, or eager vs upstream.
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
from anetts.compile.convert import convert_functions
from anetts.compile.reference import load_reference
from anetts.gate import score_outputs, valid_part
from anetts.metrics import compare, logit_rows, top1_agreement
from anetts.provenance import provenance
from anetts.scenario import STATE, Scenario, positions, save_scenario
from anetts.stage import Family

log = logging.getLogger(__name__)

# The replay runs the recorded ops on the inputs they were recorded on; anything above this is a graph
# that does not reproduce its recording (a draw inside it, an op the tracer did not see), not rounding.
TRACE_REL_TOL = 1e-4
# The fp32 wrapper and fp32 upstream do the same math in another op order; below this SNR on any
# call the wrapper is wrong (a RoPE layout, a mask, a missing norm), not rounded.
EAGER_MIN_DB = 70.0


class ExportError(RuntimeError):
    pass


def _as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def trace_with_outputs(module: torch.nn.Module, args: tuple) -> tuple[torch.jit.ScriptModule, tuple]:
    """torch.jit.trace of `module` on `args`, and the outputs of that recording pass. The tracer runs
    every op eagerly on the real tensors while it records, so these are the eager wrapper's outputs:
    a separate eager call (a full forward: 35 s of the generator's 30 s bucket at full size) would
    only compute them again."""
    seen = []
    hook = module.register_forward_hook(lambda _m, _args, out: seen.append(_as_tuple(out)))
    try:
        traced = torch.jit.trace(module, args, check_trace=False, strict=False)
    finally:
        hook.remove()
    (outputs,) = seen  # the top-level call only: the hook is on `module` itself
    return traced, tuple(o.detach().clone() for o in outputs)


def trace_function(module, fn, inputs: dict, where: str, fresh_copy: bool) -> tuple:
    """Trace `fn` on `inputs`; check the outputs' count and shapes against its spec and the replay
    against eager. `fresh_copy`: trace a copy, because forward writes the state buffers.
    Returns (traced module, trace-vs-eager errors, eager outputs, replay outputs, replay seconds)."""
    args = tuple(torch.from_numpy(np.ascontiguousarray(inputs[t.name])) for t in fn.inputs)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced, eager = trace_with_outputs(copy.deepcopy(module) if fresh_copy else module, args)
        t0 = time.perf_counter()
        replay = _as_tuple(traced(*args))
        replay_s = time.perf_counter() - t0
    if len(eager) != len(fn.outputs):
        raise ExportError(f"{where}: {fn.name} returned {len(eager)} outputs, its spec has {len(fn.outputs)}")
    errors = {}
    for t, e, r in zip(fn.outputs, eager, replay):
        if tuple(e.shape) != t.shape:
            raise ExportError(f"{where}: output {t.name} has shape {tuple(e.shape)}, spec says {t.shape}")
        max_abs = float((e.double() - r.double()).abs().max())
        scale = float(e.double().abs().max()) or 1.0
        errors[t.name] = {"max_abs": max_abs, "ref_absmax": scale}
        if not np.isfinite(max_abs) or max_abs > TRACE_REL_TOL * scale:
            raise ExportError(f"{where}: traced output {t.name} differs from eager by {max_abs:.3g}")
    as_numpy = lambda outs: {t.name: o.numpy() for t, o in zip(fn.outputs, outs)}  # noqa: E731
    return traced, errors, as_numpy(eager), as_numpy(replay), replay_s


def record_eager(module, scenario: Scenario) -> list[dict[str, np.ndarray]]:
    """Run the calls on the eager torch `module` in order; per call, its outputs and states.

    `module.forward` takes the function's inputs in spec order (whatever function a call
    names: one module serves every entry point, as one set of weights does in the package) and
    updates the state buffers (`register_buffer` named like the states) in place.  The buffers
    are zeroed first, because Core ML allocates states zero-filled.  Returns, per call,
    `{output name: array, "state/<name>": array}` in float32 / int32.
    """
    buffers = dict(module.named_buffers())
    missing = [t.name for t in scenario.states if t.name not in buffers]
    if missing:
        raise ValueError(f"scenario {scenario.name}: the module has no buffers {missing}; "
                         f"buffers: {sorted(buffers)}")
    out = []
    with torch.no_grad():
        for t in scenario.states:
            buffers[t.name].zero_()
        for c in scenario.calls:
            fn = scenario.functions[c.function]
            args = tuple(torch.from_numpy(np.ascontiguousarray(c.inputs[t.name])) for t in fn.inputs)
            res = _as_tuple(module(*args))
            if len(res) != len(fn.outputs):
                raise ValueError(f"scenario {scenario.name}: {c.function} returned {len(res)} outputs, "
                                 f"its spec has {len(fn.outputs)}")
            rec = {t.name: r.detach().cpu().numpy().astype(t.np_dtype) for t, r in zip(fn.outputs, res)}
            for t in fn.states:
                rec[STATE + t.name] = buffers[t.name].detach().cpu().float().numpy().copy()
            out.append(rec)
    return out


def _top1(logits: list[str], scenario: Scenario, expected: list[dict], got: list[dict]) -> dict:
    """Per logits output, the top-1 agreement of `got` with `expected` over each call's valid rows
    (a padded prefill block's are not)."""
    top1 = {}
    for name in logits:
        calls = [i for i, e in enumerate(expected) if name in e]
        regions = [scenario.calls[i].valid.get(name) for i in calls]
        top1[name] = top1_agreement(logit_rows(valid_part(expected[i][name], r) for i, r in zip(calls, regions)),
                                    logit_rows(valid_part(got[i][name], r) for i, r in zip(calls, regions)))
    return top1


def _eager_vs_upstream(where: str, stage, scenario: Scenario, eager: list[dict], upstream: list[dict]) -> dict:
    """The fp32 wrapper against upstream, every call (the package is later scored against upstream alone)."""
    worst, per_output = {}, {}
    for i, (e, u) in enumerate(zip(eager, upstream)):
        valid = scenario.calls[i].valid
        for name, want in u.items():
            db = compare(valid_part(want, valid.get(name)), valid_part(e[name], valid.get(name)))["snr_db"]
            worst[name] = min(worst.get(name, np.inf), db)
            per_output.setdefault(name, []).append(round(float(db), 2))
    bad = {k: v for k, v in worst.items() if not v >= EAGER_MIN_DB}
    if bad:
        raise ExportError(f"{where}: the eager wrapper differs from upstream (worst dB per output "
                          f"{ {k: round(float(v), 1) for k, v in bad.items()} }, need >= {EAGER_MIN_DB})")
    min_db = {k: round(float(v), 2) for k, v in worst.items()}
    return {"program": "eager", "min_snr_db": min(min_db.values()), "outputs": {k: {"snr_db": v} for k, v in min_db.items()},
            "top1": _top1(list(stage.logits_outputs()), scenario, upstream, eager),
            "per_call_db": per_output, "gate_db": EAGER_MIN_DB}


def write_export(report: dict, traced: dict, scenario: Scenario, expected: list, out_functions: Path,
                 out_scenario: Path, out_json: Path) -> dict:
    """The one writer of an export: `traced` {function: module} into the functions folder, the
    scenario with its expected outputs per call, the report."""
    with atomic_outputs(out_functions, out_scenario, out_json) as (tmp_fns, tmp_scenario, tmp_json):
        tmp_fns.mkdir()
        for name, module in traced.items():
            torch.jit.save(module, str(tmp_fns / f"{name}.pt"))
        save_scenario(tmp_scenario, scenario, expected)
        write_json(tmp_json, report)
    log.info("exported %s/%s: %d functions, %d calls (%s)", report["stage"], report["bucket"], len(traced),
             len(scenario.calls), report["seconds"])
    return report


def export_stage(family: Family, stage_name: str, bucket: str, size: int, params: dict | None, weights_dir: Path,
                 reference: Path | None, out_functions: Path, out_scenario: Path, out_json: Path, model=None) -> dict:
    """Rule `export`. `params`: the stage's build parameters (`WorkflowConfig.stage_params`);
    `model`: what `Stage.load` would return, when the caller has it already."""
    out_functions, out_scenario, out_json = Path(out_functions), Path(out_scenario), Path(out_json)
    clear_outputs(out_functions, out_scenario, out_json)
    where = f"{stage_name}/{bucket}"
    t0 = time.perf_counter()
    stage = family.stage(stage_name, params, weights_dir)
    functions = stage.functions(size)
    model = model if model is not None else stage.load(Path(weights_dir), size)
    module = stage.build(model).eval()
    scenario, upstream = stage.scenario(model, Path(weights_dir), size, load_reference(reference))
    t1 = time.perf_counter()
    if upstream is not None:
        eager = record_eager(copy.deepcopy(module), scenario)
        torch_figure = _eager_vs_upstream(where, stage, scenario, eager, upstream)
        expected = [{**{k: v for k, v in e.items() if k.startswith(STATE)}, **u} for e, u in zip(eager, upstream)]
    t2 = time.perf_counter()

    first = {}  # each function is traced on its first call's inputs
    for c in scenario.calls:
        first.setdefault(c.function, c)
    traced, trace_errors, recorded = {}, {}, {}
    for fn in functions:
        if fn.name not in first:
            raise ExportError(f"{where}: the scenario never calls function {fn.name!r}; parity could not check it")
        traced[fn.name], trace_errors[fn.name], *recorded[fn.name] = trace_function(
            module, fn, first[fn.name].inputs, where, fresh_copy=bool(scenario.states))
    t3 = time.perf_counter()

    if upstream is None:  # the eager wrapper is the reference: the tracing pass recorded it, once per function
        if scenario.states or len(scenario.calls) != len(functions):
            raise ExportError(f"{where}: a scenario without expected outputs must call each function once, "
                              f"statelessly; it has {len(scenario.calls)} calls")
        expected = [recorded[c.function][0] for c in scenario.calls]
        replayed = [recorded[c.function][1] for c in scenario.calls]
        scored = [score_outputs(scenario.functions[c.function], r, e, dict(c.valid))
                  for c, e, r in zip(scenario.calls, expected, replayed)]
        torch_figure = {"program": "traced", "outputs": {k: m for s in scored for k, m in s["outputs"].items()},
                        "min_snr_db": min((s["min_snr_db"] for s in scored if s["min_snr_db"] is not None),
                                          default=None),
                        "top1": _top1(list(stage.logits_outputs()), scenario, expected, replayed)}
        torch_s = round(sum(recorded[c.function][2] for c in scenario.calls), 4)
    else:
        torch_s = round(t2 - t1, 3)

    pos = positions(scenario)
    report = {
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
        "positions_checked": [min(pos), max(pos)],
        "logits_outputs": list(stage.logits_outputs()),
        "uncompressed_weights": list(stage.uncompressed_weights()),
        # what the expected outputs are: upstream's tensors, or the eager wrapper's
        "reference": "eager" if upstream is None else "upstream",
        # torch's own figure, reported by parity as its `torch_trace` backend
        "torch": torch_figure,
        "trace_vs_eager": trace_errors,
        # torch_scenario: torch's time for the scenario (the traced replay, or the eager calls), the
        # baseline of parity's time ratios
        "seconds": {"prepare": round(t1 - t0, 3), "trace": round(t3 - t2, 3), "torch_scenario": torch_s},
        "provenance": provenance(),
    }
    return write_export(report, traced, scenario, expected, out_functions, out_scenario, out_json)


def synthetic_inputs(fn, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs to trace `fn` on when no scenario gives them: standard normal floats, zero ints
    (positions 0)."""
    rng = np.random.default_rng(seed)
    return {t.name: np.zeros(t.shape, np.int32) if t.dtype == "int32" else rng.standard_normal(t.shape).astype(np.float32)
            for t in fn.inputs}


def compile_module(module, functions, out_dir: Path, options, model_meta: dict, stage: str,
                   geometry: dict | None = None) -> tuple[Path, dict]:
    """`module`'s functions traced (checked against eager, on `synthetic_inputs`), converted and
    merged into `out_dir/<stage>.mlpackage`: rules export + convert of a stage with states in one
    call, for tests and benchmarks. Returns (package, {function: convert report, with its trace
    seconds}, plus "bundle_seconds")."""
    out_dir, functions = Path(out_dir), list(functions)
    out_dir.mkdir(parents=True, exist_ok=True)
    torchscripts, trace_s = {}, {}
    for fn in functions:
        t0 = time.perf_counter()
        traced = trace_function(module, fn, synthetic_inputs(fn), stage, fresh_copy=True)[0]
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
