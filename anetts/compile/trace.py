"""Export one stage at one bucket: torch.jit.trace, checked against the eager wrapper.

Outputs (written atomically, nothing is left behind on failure):
    <bucket>.pt            TorchScript
    <bucket>.inputs.npz    the example inputs it was traced with
    <bucket>.outputs.npz   eager wrapper outputs (`eager/<name>`, parity's fp32 reference) and the
                           traced module's (`traced/<name>`), so parity runs neither again
    <bucket>.export.json   bucket spec, valid regions, trace-vs-eager errors, timings, provenance
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

# Traced and eager graphs do the same float ops; anything above this is a tracing bug
# (data-dependent Python control flow frozen at trace time), not rounding.
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
        eager = _as_tuple(wrapper(*args))
        t_eager = time.perf_counter()
        traced = torch.jit.trace(wrapper, args, check_trace=False, strict=False)
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
        # eager_forward: one (first) call of the eager wrapper, the baseline of parity's time ratios
        "seconds": {"prepare": round(t1 - t0, 3), "trace": round(t2 - t1, 3),
                    "eager_forward": round(t_eager - t1, 4), "traced_forward": round(t2 - t_traced, 4)},
        "provenance": provenance(),
    }
    outputs = {f"{kind}/{t.name}": o.numpy() for kind, outs in (("eager", eager), ("traced", replay))
               for t, o in zip(spec.outputs, outs)}
    return traced, inputs, spec, report, outputs


def export_stage(family: Family, stage_name: str, size: int, weights_dir: Path,
                 out_pt: Path, out_inputs: Path, out_json: Path, out_outputs: Path,
                 model=None, reference: Path | None = None) -> dict:
    clear_outputs(out_pt, out_inputs, out_json, out_outputs)
    traced, inputs, spec, report, outputs = trace_stage(family, stage_name, size, weights_dir, model, reference)
    with atomic_outputs(out_pt, out_inputs, out_json, out_outputs) as (tmp_pt, tmp_inputs, tmp_json, tmp_outputs):
        torch.jit.save(traced, str(tmp_pt))
        for path, arrays in ((tmp_inputs, inputs), (tmp_outputs, outputs)):
            with open(path, "wb") as f:
                np.savez(f, **arrays)
        write_json(tmp_json, report)
    log.info("exported %s/%s (%s)", stage_name, spec.bucket, report["seconds"])
    return report
