"""Parity of one Core AI asset: Apple's runtime vs the export job's eager fp32 outputs, gated.

The second parity backend beside the MIL executor: the same example inputs, the same valid
regions, the same scoring and gates as `anetts.verify.parity`, but the program is the Core AI
conversion and the executor is Apple's (its Linux CPU runtime here, the OS runtime on macOS).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from anetts.compile.aimodel import run_asset
from anetts.compile.bundle import function_name
from anetts.provenance import provenance
from anetts.stage import Family
from anetts.verify.parity import Gate, _score, _valid, load_export_outputs


def score_asset(asset: Path, spec, inputs: dict, reference: dict, regions: dict, gate: Gate,
                function: str | None = None) -> tuple[dict, dict]:
    """(scored backend entry, raw outputs) of one asset function against `reference`."""
    t0 = time.perf_counter()
    out = run_asset(asset, inputs, function)
    seconds = time.perf_counter() - t0
    missing = [t.name for t in spec.outputs if t.name not in out]
    if missing:
        raise KeyError(f"{asset}: the runtime returned no {missing}")
    return {**_score(spec, out, reference, regions, gate), "seconds": seconds}, out


def run_aimodel_parity(family: Family, stage_name: str, size: int, asset: Path, example_inputs: Path,
                       export_outputs: Path, export_report: Path | None, gate: Gate,
                       asset_report: Path | None = None) -> dict:
    """A report shaped like `run_parity`'s, with the `coreai` backend; `check_parity` gates it."""
    stage = family.stage(stage_name)
    spec = stage.spec(size)
    with np.load(example_inputs) as z:
        inputs = {k: z[k] for k in z.files}
    regions = stage.valid_regions(inputs)
    reference, _ = load_export_outputs(export_outputs, spec)
    seconds = json.loads(Path(export_report).read_text())["seconds"] if export_report is not None else {}
    eager_s = seconds.get("eager_forward")
    precision = json.loads(Path(asset_report).read_text())["precision"] if asset_report is not None else None
    fn = function_name(spec.bucket)
    entry, out = score_asset(asset, spec, inputs, reference, regions, gate, fn)
    entry["precision"] = precision
    arrays = {}
    for t in spec.outputs:
        region = regions.get(t.name)
        arrays[f"reference/{t.name}"] = _valid(reference[t.name], region)
        arrays[f"coreai/{t.name}"] = _valid(np.asarray(out[t.name]).reshape(reference[t.name].shape), region)
    return {
        "stage": stage_name,
        "bucket": spec.bucket,
        "function": fn,
        "asset": Path(asset).name,
        "gate": asdict(gate),
        "valid_regions": {k: list(v) for k, v in regions.items() if v is not None},
        "eager_seconds": eager_s,
        "coreai_vs_eager_time_ratio": entry["seconds"] / eager_s if eager_s else None,
        "backends": {"coreai": entry},
        "passed": entry["passed"],
        "provenance": provenance(),
        "_arrays": arrays,
    }
