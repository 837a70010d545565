"""Compile a Fish AR stage outside the DAG (tests, benchmarks) and play a scenario on it.

`export_stage` traces a stage's module once per function, converts each (`convert_function`,
with its states) and bundles them into one package. The compiled stages are composed by the
runtime's decode loop (`runtime.FishDecoder`; over bare packages: `chain_check.compiled_decoder`).
"""
from __future__ import annotations

import copy
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from anetts.artifacts import write_json
from anetts.verify.scenario import Scenario


def export_stage(module: torch.nn.Module, functions, out_dir: Path, options, model_meta: dict, stage: str,
                 geometry: dict | None = None) -> tuple[Path, dict]:
    """Trace (checked against eager), convert and bundle `functions` of `module` into
    `out_dir/<stage>.mlpackage`; returns (package, {function: convert report} + bundle seconds)."""
    from anetts.compile.bundle import bundle_packages
    from anetts.compile.convert import convert_function

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fns = {f.name: f for f in functions}
    packages, reports = {}, {}
    for name, fn in fns.items():
        g = torch.Generator().manual_seed(0)
        args = tuple(torch.zeros(t.shape, dtype=torch.int32) if t.dtype == "int32" else torch.randn(t.shape, generator=g)
                     for t in fn.inputs)
        t0 = time.perf_counter()
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            eager = copy.deepcopy(module)(*args)  # tracing runs forward, which writes the caches: use copies
            traced = torch.jit.trace(copy.deepcopy(module), args)
            torch.testing.assert_close(traced(*args), eager)
        ts = out_dir / f"{stage}.{name}.pt"
        traced.save(str(ts))
        trace_s = time.perf_counter() - t0
        packages[name] = out_dir / f"{stage}.{name}.mlpackage"
        reports[name] = convert_function(ts, fn, packages[name], out_dir / f"{stage}.{name}.json", options, model_meta,
                                         stage=stage, geometry=geometry)
        reports[name]["seconds"]["trace"] = round(trace_s, 3)
    out = out_dir / f"{stage}.mlpackage"
    t0 = time.perf_counter()
    bundle_packages(packages, out, default_function=next(iter(fns)))
    reports["bundle_seconds"] = round(time.perf_counter() - t0, 3)
    # beside the package, as the DAG's convert report: its typed functions (what a runner loads)
    write_json(out.with_suffix(".json"), {"stage": stage, "default_function": next(iter(fns)),
                                          "functions": [f.to_json() for f in fns.values()]})
    return out, reports


def package_bytes(package: Path) -> int:
    return sum(p.stat().st_size for p in Path(package).rglob("*") if p.is_file())


def play_mil(package: Path, scenario: Scenario) -> list[dict[str, np.ndarray]]:
    """Every call's outputs on the MIL executor's runner, one state carried through (run_scenario
    scores; this keeps the outputs, e.g. for top-1 agreement of logits)."""
    from anetts.models.fish.chain_check import mil_program

    program = mil_program(Path(package).stem, package)
    state = program.new_state(scenario.calls[0].function) if scenario.states else None
    return [program.run(c.function, dict(c.inputs), state) for c in scenario.calls]
