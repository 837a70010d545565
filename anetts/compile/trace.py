"""Export one stateless stage at one bucket: torch.jit.trace, checked against the eager wrapper.

The export layout of every stage kind (`anetts.artifacts.export_files`, written by `write_export`
atomically, nothing left behind on failure):
    <bucket>.functions/<function>.pt  TorchScript per function (a stateless bucket: `main` alone)
    <bucket>.scenario.npz             the calls parity plays (`anetts.verify.scenario.save_scenario`);
                                      a stateless bucket: one call of `main` on its example inputs,
                                      the eager wrapper's outputs expected (parity's fp32 reference)
                                      and the traced module's kept, so parity runs neither again
    <bucket>.export.json              spec, valid regions, trace-vs-eager errors, timings, provenance

A stage of several functions with states records its scenario from upstream instead
(`anetts.compile.scenario_export`).
"""
from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from anetts.artifacts import atomic_outputs, clear_outputs, write_json
from anetts.provenance import provenance
from anetts.stage import BucketSpec, Family

log = logging.getLogger(__name__)

# The replay runs the recorded ops on the inputs they were recorded on; anything above this is a graph
# that does not reproduce its recording (a draw inside it, an op the tracer did not see), not rounding.
TRACE_REL_TOL = 1e-4


class ExportError(RuntimeError):
    pass


def _as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def load_reference(path: Path | None) -> dict | None:
    if path is None:
        return None
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def write_reference(family: Family, size: int, weights_dir: Path, out: Path, **params) -> dict:
    """The family's shared example run for one bucket size, as an .npz of named arrays.
    `params`: the run's other config parameters (a scenario family's frames)."""
    clear_outputs(out)
    t0 = time.perf_counter()
    ref = family.make_reference(family.load_model(weights_dir, None), Path(weights_dir), size, **params)
    with atomic_outputs(out) as (tmp,):
        with open(tmp, "wb") as f:
            np.savez(f, **ref)
    log.info("reference for size %s in %.1fs", size, time.perf_counter() - t0)
    return ref


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


def trace_stage(family: Family, stage_name: str, size: int, weights_dir: Path, model=None, reference: Path | None = None):
    """Returns (traced module, example inputs, spec, report dict, outputs {eager/<name>, traced/<name>})."""
    stage = family.stage(stage_name)
    spec: BucketSpec = stage.spec(size)
    t0 = time.perf_counter()
    model = model if model is not None else family.load_model(weights_dir, stage_name)
    wrapper = stage.build(model)
    inputs = stage.example_inputs(model, Path(weights_dir), size, load_reference(reference))
    for t in spec.inputs:
        t.check(inputs[t.name], f"example input of {stage_name}/{spec.bucket}")
    args = tuple(torch.from_numpy(inputs[t.name]) for t in spec.inputs)
    t1 = time.perf_counter()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced, eager = trace_with_outputs(wrapper, args)
        t_traced = time.perf_counter()
        replay = _as_tuple(traced(*args))
    t2 = time.perf_counter()
    if len(eager) != len(spec.outputs):
        raise ExportError(f"{stage_name}/{spec.bucket}: wrapper returned {len(eager)} outputs, spec has {len(spec.outputs)}")
    errors = {}
    for t, e, r in zip(spec.outputs, eager, replay):
        if tuple(e.shape) != t.shape:
            raise ExportError(f"{stage_name}/{spec.bucket}: output {t.name} has shape {tuple(e.shape)}, spec says {t.shape}")
        e64, r64 = e.double(), r.double()
        max_abs = float((e64 - r64).abs().max())
        scale = float(e64.abs().max()) or 1.0
        errors[t.name] = {"max_abs": max_abs, "ref_absmax": scale}
        if not np.isfinite(max_abs) or max_abs > TRACE_REL_TOL * scale:
            raise ExportError(f"{stage_name}/{spec.bucket}: traced output {t.name} differs from eager by {max_abs:.3g}")
    regions = stage.valid_regions(inputs)
    report = {
        "spec": spec.to_json(),
        # per output: [axis, valid length] implied by the example's masks (None: all valid), so
        # parity scores the valid region without importing the family
        "valid_regions": {t.name: (list(regions[t.name]) if regions.get(t.name) is not None else None)
                          for t in spec.outputs},
        "trace_vs_eager": errors,
        "uncompressed_weights": list(stage.uncompressed_weights()),
        # trace: the recording pass (it computes the eager outputs) and the replay; traced_forward:
        # one call of the traced module, the torch baseline of parity's time ratios
        "seconds": {"prepare": round(t1 - t0, 3), "trace": round(t2 - t1, 3),
                    "traced_forward": round(t2 - t_traced, 4)},
        "provenance": provenance(),
    }
    outputs = {f"{kind}/{t.name}": o.numpy() for kind, outs in (("eager", eager), ("traced", replay))
               for t, o in zip(spec.outputs, outs)}
    return traced, inputs, spec, report, outputs


def write_export(report: dict, traced: dict, scenario, expected: list, out_functions: Path, out_scenario: Path,
                 out_json: Path, traced_outputs: list | None = None) -> dict:
    """The one writer of an export: `traced` {function: module} into the functions folder, the
    scenario with its expected (and traced) outputs per call, the report."""
    from anetts.verify.scenario import save_scenario

    with atomic_outputs(out_functions, out_scenario, out_json) as (tmp_fns, tmp_scenario, tmp_json):
        tmp_fns.mkdir()
        for name, module in traced.items():
            torch.jit.save(module, str(tmp_fns / f"{name}.pt"))
        save_scenario(tmp_scenario, scenario, expected, traced_outputs)
        write_json(tmp_json, report)
    log.info("exported %s/%s: %d functions, %d calls (%s)", report["stage"], report["bucket"], len(traced),
             len(scenario.calls), report["seconds"])
    return report


def export_stage(family: Family, stage_name: str, size: int, weights_dir: Path,
                 out_functions: Path, out_scenario: Path, out_json: Path, model=None,
                 reference: Path | None = None) -> dict:
    """A stateless bucket as a one-call scenario of its function `main` (BucketSpec.function)."""
    from anetts.verify.scenario import Call, Scenario

    clear_outputs(out_functions, out_scenario, out_json)
    traced, inputs, spec, report, outputs = trace_stage(family, stage_name, size, weights_dir, model, reference)
    fn = spec.function()
    regions = {k: (tuple(v) if v is not None else None) for k, v in report["valid_regions"].items()}
    call = Call(fn.name, {t.name: inputs[t.name] for t in fn.inputs}, regions)
    scenario = Scenario(f"{stage_name}/{spec.bucket}", {fn.name: fn}, (call,))
    expected, replay = ({t.name: outputs[f"{kind}/{t.name}"] for t in fn.outputs} for kind in ("eager", "traced"))
    report = {"kind": "bucketed", "stage": stage_name, "bucket": spec.bucket, **report}
    return write_export(report, {fn.name: traced}, scenario, [expected], out_functions, out_scenario, out_json,
                        [replay])
