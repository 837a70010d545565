"""Convert one stage/bucket into an Apple Core AI asset (`.aimodel`, OS 27+) and run it on Linux.

Route: the stage wrapper → `torch.export` → `run_decompositions(coreai_torch.get_decomp_table())`
→ `coreai_torch.TorchConverter` → `AIProgram.save_asset`. The TorchScript of the export job cannot be
re-exported with `torch.export`, so the wrapper is rebuilt from the weights and fed the export job's
example inputs; its eager outputs must equal the export's stored eager outputs, so the asset and the
`.mlpackage` come from the same program and share one fp32 reference.

Precision: `fp16` converts the half-precision module, which makes the asset's float inputs and
outputs fp16 as well (Core AI has no option to keep fp32 I/O); `run_asset` casts at the boundary.

Execution: `coreai-core` ships Apple's CPU runtime for Linux; on macOS the same call runs the OS
runtime. A raw `.aimodel` only loads through `AIModelAsset.executable()` on Linux.
"""
from __future__ import annotations

import copy
import json
import logging
import time
import warnings
from pathlib import Path

import numpy as np

from anetts.artifacts import atomic_outputs, clear_outputs, tree_bytes, tree_sha256, write_json
from anetts.tensors import function_name
from anetts.compile.convert import PRECISIONS
from anetts.compile.stamp import package_stamp
from anetts.compile.export import TRACE_REL_TOL
from anetts.provenance import provenance
# running an asset is the runtime's coreai runner; the converter checks what it wrote with the same code
from anetts.runtime.runners import AIModelError, asset_summary, run_asset  # noqa: F401 - AIModelError, run_asset re-exported
from anetts.runtime.runners import asset_io as function_io
from anetts.scenario import load_scenario
from anetts.stage import Family
from anetts.tensors import FunctionSpec

log = logging.getLogger(__name__)



def _coreai():
    with warnings.catch_warnings():
        # coreai-torch warns that torch > 2.13.0 is unvalidated; the project pins 2.13.0
        warnings.simplefilter("ignore")
        import coreai_torch
    return coreai_torch


def asset_io(asset_path: Path) -> dict:
    """Functions and per-function I/O (name, shape, dtype) of a saved asset, and its op counts."""
    summary = asset_summary(asset_path)
    ops = {}
    try:
        ops = {str(k): int(v) for k, v in dict(summary.operation_distribution).items()}
    except (TypeError, ValueError, AttributeError):
        ops = {}
    return {"functions": function_io(asset_path, summary), "ops": ops}


def _io_dtype(spec_dtype: str, precision: str) -> str:
    return "float16" if spec_dtype == "float32" and precision == "fp16" else spec_dtype


def check_asset_io(spec: FunctionSpec, io: dict, function: str, precision: str, where) -> None:
    """The asset's function must have exactly the export's names and shapes (fp16 floats at fp16)."""
    if function not in io["functions"]:
        raise AIModelError(f"{where}: no function {function!r}; functions: {sorted(io['functions'])}")
    fn = io["functions"][function]
    for kind, tensors in (("inputs", spec.inputs), ("outputs", spec.outputs)):
        want = {t.name: (list(t.shape), _io_dtype(t.dtype, precision)) for t in tensors}
        got = {t["name"]: (t["shape"], t["dtype"]) for t in fn[kind]}
        if got != want:
            raise AIModelError(f"{where}: {kind} {got} do not match the export spec {want}")


def _export(wrapper, args: tuple, precision: str):
    """(exported program, the args it was exported with): fp16 exports the half-precision module."""
    import torch

    coreai_torch = _coreai()
    if precision not in PRECISIONS:
        raise AIModelError(f"unknown precision {precision!r}; choose one of {PRECISIONS}")
    if precision == "fp16":
        wrapper = copy.deepcopy(wrapper).half()
        args = tuple(a.half() if a.is_floating_point() else a for a in args)
    with torch.no_grad():
        ep = torch.export.export(wrapper.eval(), args)
        ep = ep.run_decompositions(coreai_torch.get_decomp_table())
    return ep, args


def convert_module(wrapper, inputs: dict[str, np.ndarray], spec: FunctionSpec, stage: str, bucket: str,
                   geometry: dict, out_asset: Path, out_report: Path, precision: str, model_meta: dict,
                   function: str | None = None) -> dict:
    """Export, convert and save one module as a one-function asset; checked, then moved into place.

    `spec`: the module's function (I/O); `stage`, `bucket`, `geometry`: what the asset is stamped
    with. `inputs`: example inputs by name (the spec's dtypes); `function`: the asset's function name
    (default: the bucket's bundle function name, `t32`, `b3s`, ...).
    """
    import torch

    out_asset, out_report = Path(out_asset), Path(out_report)
    clear_outputs(out_asset, out_report)
    coreai_torch = _coreai()
    function = function or function_name(bucket)
    where = f"{stage}/{bucket}"
    for t in spec.inputs:
        if t.name not in inputs:
            raise AIModelError(f"{where}: example inputs lack input: {t.name}")
        t.check(inputs[t.name], f"example input of {where}")
    args = tuple(torch.from_numpy(np.ascontiguousarray(inputs[t.name])) for t in spec.inputs)

    t0 = time.perf_counter()
    try:
        ep, _ = _export(wrapper, args, precision)
    except AIModelError:
        raise
    except Exception as e:
        raise AIModelError(f"torch.export failed on {where}: {type(e).__name__}: {e}") from e
    t1 = time.perf_counter()
    try:
        converter = coreai_torch.TorchConverter(mode=coreai_torch.TorchConverter.Mode.RELEASE)
        converter.add_exported_program(ep, input_names=[t.name for t in spec.inputs],
                                       output_names=[t.name for t in spec.outputs], entrypoint_name=function)
        program = converter.to_coreai()
    except Exception as e:
        raise AIModelError(f"coreai-torch failed on {where}: {type(e).__name__}: {e}") from e
    t2 = time.perf_counter()

    package = package_stamp(model_meta, stage, bucket, geometry, precision)
    meta = package.metadata

    def stamp(m):
        m.author = package.author
        m.license = package.licence
        m.model_description = package.description
        for k, v in meta.items():
            m.set_custom(k, v)

    with atomic_outputs(out_asset, out_report) as (tmp_asset, tmp_report):
        asset = program.save_asset(tmp_asset)
        asset.update_metadata(stamp)
        io = asset_io(tmp_asset)
        check_asset_io(spec, io, function, precision, tmp_asset)
        report = {
            "stage": stage,
            "bucket": bucket,
            "function": function,
            "geometry": geometry,
            "asset": out_asset.name,
            "sha256": tree_sha256(tmp_asset),
            "bytes": tree_bytes(tmp_asset),
            "precision": precision,
            "minimum_os": "27",
            **io["functions"][function],
            "ops": io["ops"],
            "n_ops": sum(io["ops"].values()),
            "seconds": {"export": round(t1 - t0, 3), "convert": round(t2 - t1, 3),
                        "total": round(time.perf_counter() - t0, 3)},
            "metadata": meta,
            "provenance": provenance(),
        }
        write_json(tmp_report, report)
    log.info("converted %s to Core AI (%s) in %.1fs, %d ops", where, precision, report["seconds"]["total"], report["n_ops"])
    return report


def convert_stage(family: Family, stage_name: str, size: int, weights_dir: Path, scenario: Path,
                  export_report: Path, out_asset: Path, out_report: Path,
                  precision: str, model_meta: dict, model=None, params: dict | None = None) -> dict:
    """A one-call stage at one bucket from its export (`anetts.compile.export`) to an asset.

    The rebuilt wrapper must reproduce the export's stored eager outputs on its one call's inputs:
    otherwise the weights or the stage code changed since the export and the two formats would
    not be the same model.
    """
    import torch

    clear_outputs(out_asset, out_report)
    stage = family.stage(stage_name, params, weights_dir)
    spec, bucket = stage.function(size), stage.bucket_name(size)
    export = json.loads(Path(export_report).read_text(encoding="utf-8"))
    if export["functions"] != [spec.to_json()] or export["bucket"] != bucket:
        raise AIModelError(f"{export_report}: export {export['bucket']} does not match {stage_name} at size {size}; "
                           f"re-run the export")
    sc, expected = load_scenario(scenario)
    if len(sc.calls) != 1:
        raise AIModelError(f"{scenario}: {len(sc.calls)} calls; a Core AI asset is made of a one-call export")
    inputs, stored = sc.calls[0].inputs, expected[0]
    model = model if model is not None else stage.load(Path(weights_dir), size)
    wrapper = stage.build(model).eval()
    args = tuple(torch.from_numpy(inputs[t.name]) for t in spec.inputs)
    with torch.no_grad():
        eager = wrapper(*args)
    eager = eager if isinstance(eager, tuple) else (eager,)
    for t, e in zip(spec.outputs, eager):
        ref = stored[t.name].astype(np.float64)
        diff = float(np.abs(e.double().numpy() - ref).max())
        if not np.isfinite(diff) or diff > TRACE_REL_TOL * (float(np.abs(ref).max()) or 1.0):
            raise AIModelError(f"{stage_name}/{bucket}: rebuilt wrapper's {t.name} differs from the export's eager "
                               f"output by {diff:.3g}; the weights or stage code changed since the export")
    return convert_module(wrapper, inputs, spec, stage_name, bucket, stage.geometry(size), out_asset, out_report,
                          precision, model_meta)
