"""Parity of one stage/bucket: upstream eager fp32 vs the traced export, the compiled package run by
the MIL reference executor, and (on macOS) CoreML itself — compared on the valid region only. The
same check scores a Core AI asset (`anetts.verify.aimodel_parity`): every program runs through the
runners of :mod:`anetts.runtime.runners`.

A package below its gate fails: `check_parity` raises after writing the failing report next to
where the passing one would go, so the Snakemake rule exits non-zero and nothing downstream runs.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np

from anetts.artifacts import atomic_outputs, clear_outputs, failed_report_path, write_json
from anetts.options import Gate  # noqa: F401 - re-exported
from anetts.provenance import provenance
from anetts.stage import BucketSpec, FunctionSpec
from anetts.verify.metrics import compare, exact_match_fraction

log = logging.getLogger(__name__)


class ParityError(RuntimeError):
    pass


def write_verdict(report: dict, out_json: Path, why_failed: Callable[[dict], str], arrays: dict | None = None,
                  out_arrays: Path | None = None) -> dict:
    """The one writer of a gate's verdict. Passed: the report (and `arrays` to `out_arrays`) written
    atomically, an earlier failure beside it removed. Failed: the report to `failed_report_path`,
    nothing at the outputs, and a ParityError: `why_failed(report)` and where the report is."""
    outs = (Path(out_json),) + ((Path(out_arrays),) if out_arrays is not None else ())
    clear_outputs(*outs, failed_report_path(out_json))
    if not report["passed"]:
        raise_failed(report, out_json, why_failed(report))
    with atomic_outputs(*outs) as tmps:
        write_json(tmps[0], report)
        if out_arrays is not None:
            with open(tmps[1], "wb") as f:
                np.savez_compressed(f, **(arrays or {}))
    return report


def raise_failed(report: dict, out_json: Path, why: str):
    """Write a failed gate's report beside `out_json` and raise a ParityError saying `why` and where."""
    failed = failed_report_path(out_json)
    write_json(failed, report)
    raise ParityError(f"{why}; report: {failed}")


def valid_part(array: np.ndarray, region: tuple[int, int] | None) -> np.ndarray:
    """The first `n` entries of `array` along `axis` for a region (axis, n); all of it for None
    (the valid part of an output or state that parity and top-1 compare)."""
    if region is None:
        return array
    axis, n = region
    return np.take(array, np.arange(n), axis=axis)


def _score(spec, outputs: dict, reference: dict, regions: dict, gate: Gate) -> dict:
    per_output, worst, exact_ok = {}, None, True
    for t in spec.outputs:
        ref = valid_part(reference[t.name], regions.get(t.name))
        got = valid_part(np.asarray(outputs[t.name]).reshape(reference[t.name].shape), regions.get(t.name))
        m = compare(ref, got)
        if t.dtype == "int32":
            m["exact_fraction"] = exact_match_fraction(ref, got)
            exact_ok &= m["exact_fraction"] >= gate.min_exact_fraction
        else:
            worst = m["snr_db"] if worst is None else min(worst, m["snr_db"])
        per_output[t.name] = m
    passed = exact_ok and (worst is None or worst >= gate.min_snr_db)
    return {"outputs": per_output, "min_snr_db": worst, "passed": bool(passed),
            "meets_target": bool(passed and (worst is None or worst >= gate.target_snr_db))}


def _timed(fn, repeats: int = 1):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def load_export_call(scenario_npz: Path, spec) -> tuple[dict, dict, dict]:
    """(inputs, eager reference, traced outputs) of a stateless export's one call (its scenario)."""
    from anetts.verify.scenario import load_scenario, load_traced

    scenario, expected = load_scenario(scenario_npz)
    traced = load_traced(scenario_npz)
    if len(scenario.calls) != 1:
        raise ParityError(f"{scenario_npz}: {len(scenario.calls)} calls; a stateless bucket's export has one")
    missing = [f"{k}/{t.name}" for k, outs in (("eager", expected[0]), ("traced", traced[0]))
               for t in spec.outputs if t.name not in outs]
    if missing:
        raise ParityError(f"{scenario_npz}: the call lacks {missing}; re-run the export")
    return dict(scenario.calls[0].inputs), expected[0], traced[0]


def read_export_report(path: Path) -> tuple[BucketSpec, dict, dict]:
    """(spec, valid regions {output: (axis, n) | None}, timings) recorded by the export job."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
        spec = BucketSpec.from_json(report["spec"])
        regions = {k: (tuple(v) if v is not None else None) for k, v in report["valid_regions"].items()}
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise ParityError(f"{path}: not a usable export report ({type(e).__name__}: {e}); re-run the export") from e
    return spec, regions, report.get("seconds", {})


def _program(executor: str, ref):
    from anetts.runtime.errors import ArtifactError
    from anetts.runtime.runners import load_program

    try:
        return load_program(executor, ref)
    except ArtifactError as e:
        raise ParityError(str(e)) from e


def run_parity(package: Path, scenario: Path, export_report: Path, gate: Gate,
               compute_units: str = "CPU_AND_GPU", function_name: str | None = None, executor: str = "mil") -> dict:
    """Score the package (and the traced export) against the eager fp32 outputs of the export job.

    The export job ran the eager wrapper and the traced module on the example inputs and stored
    both as its one-call scenario, with the bucket's spec and valid regions, so parity needs no
    family, no model and no torch.jit: one executor run per package. `executor`: ``mil`` runs the
    .mlpackage `package` (and Core ML beside it on macOS); ``coreai`` runs `package` as a Core AI asset.
    """
    from anetts.runtime.runners import PackageRef

    spec, regions, seconds = read_export_report(export_report)
    stage_name = spec.stage
    inputs, reference, traced_out = load_export_call(scenario, spec)
    traced_s = seconds.get("traced_forward")
    fn = FunctionSpec(function_name or "main", spec.inputs, spec.outputs)
    ref = PackageRef(label=f"{stage_name}/{spec.bucket}", path=Path(package), functions=(fn,), function=fn.name,
                     aimodel=Path(package) if executor == "coreai" else None, compute_units=compute_units)

    program = _program(executor, ref)
    out, out_s = _timed(lambda: program.run(fn.name, inputs))
    backends = {
        "torch_trace": {**_score(spec, traced_out, reference, regions, gate), "seconds": traced_s},
        executor: {**_score(spec, out, reference, regions, gate), "seconds": out_s},
    }
    if executor == "mil":  # Core ML runs the same package where it can
        if sys.platform == "darwin":
            coreml = _program("coreml", ref)
            cm_out, cm_s = _timed(lambda: coreml.run(fn.name, inputs))
            backends["coreml"] = {**_score(spec, cm_out, reference, regions, gate), "seconds": cm_s,
                                  "compute_units": compute_units}
        else:
            backends["coreml"] = {"skipped": f"CoreML predict needs macOS (this is {sys.platform})"}

    gated = [b for b in backends.values() if "passed" in b]
    # valid-region outputs of the reference and the package, for plots in the summary
    arrays = {}
    for t in spec.outputs:
        region = regions.get(t.name)
        arrays[f"reference/{t.name}"] = valid_part(reference[t.name], region)
        arrays[f"{executor}/{t.name}"] = valid_part(np.asarray(out[t.name]).reshape(reference[t.name].shape), region)
    return {
        "stage": stage_name,
        "bucket": spec.bucket,
        "function": fn.name,
        "gate": asdict(gate),
        "valid_regions": {k: list(v) for k, v in regions.items() if v is not None},
        # torch's time for the same graph on this machine (one call of the traced module)
        "torch_seconds": traced_s,
        f"{executor}_vs_torch_time_ratio": out_s / traced_s if traced_s else None,
        "backends": backends,
        "passed": all(b["passed"] for b in gated),
        "provenance": provenance(),
        "_arrays": arrays,
    }


def _failed_backends(report: dict) -> dict:
    """{backend: its worst dB} of the gated backends that failed."""
    return {n: b.get("min_snr_db") for n, b in report["backends"].items() if "passed" in b and not b["passed"]}


def score_export(package: Path, scenario: Path, export_report: Path, gate: Gate,
                 compute_units: str = "CPU_AND_GPU") -> dict:
    """The package against its export (rules parity, compress): a stateless bucket's one call
    (`run_parity`), or a scenario stage's calls with the state carried, logits also by top-1
    (`anetts.verify.scenario_parity`); the export report's kind says which."""
    if json.loads(Path(export_report).read_text(encoding="utf-8")).get("kind") == "scenario":
        from anetts.verify.scenario_parity import run_scenario_parity

        return run_scenario_parity(package, scenario, export_report, gate, compute_units=compute_units)
    return run_parity(package, scenario, export_report, gate, compute_units=compute_units)


def check_export_parity(report: dict, out_json: Path, out_arrays: Path) -> dict:
    """`check_parity` or, for a scenario's report, `check_scenario_parity`: write it only if it passed."""
    if report.get("kind") == "scenario":
        from anetts.verify.scenario_parity import check_scenario_parity

        return check_scenario_parity(report, out_json, out_arrays)
    return check_parity(report, out_json, out_arrays)


def check_parity(report: dict, out_json: Path, out_arrays: Path | None = None) -> dict:
    """Write the report where downstream rules find it only if it passed; otherwise raise."""
    out_json = Path(out_json)
    arrays = report.pop("_arrays", {})
    write_verdict(report, out_json, lambda r: f"{r['stage']}/{r['bucket']} failed its parity gate "
                  f"(min {r['gate']['min_snr_db']} dB): {_failed_backends(r)}", arrays, out_arrays)
    for name, b in report["backends"].items():
        if b.get("passed") and not b.get("meets_target"):
            log.warning("%s/%s %s: %.1f dB is below the %.0f dB target", report["stage"], report["bucket"], name,
                        b["min_snr_db"], report["gate"]["target_snr_db"])
    return report


def check_bundle_parity(stage_name: str, buckets: list[str], bundle: Path, packages: list, export_reports: list,
                        scenarios: list, parity_arrays: list, gate: Gate, out_json: Path) -> dict:
    """Every function of a multifunction bundle through its bucket's gate; all must pass.

    A function that is its verified package's program again (`anetts.mil.compare`: the same ops on
    the same values, no op that an opset change alters) computes the package's outputs, which its
    `parity` job stored: those are scored, and the function is not run. Any other function runs
    on the executor. The reference is the upstream eager output already stored by each bucket's
    `parity` job either way, so the bundle needs no second eager run.
    """
    from anetts.compile.bundle import function_name
    from anetts.mil.compare import function_difference, package_function
    from anetts.mil.errors import MilLoadError
    from anetts.runtime.runners import PackageRef

    specs = [read_export_report(p)[:2] for p in export_reports]
    ref = PackageRef(label=f"bundle {stage_name}", path=Path(bundle), function=function_name(buckets[0]),
                     functions=tuple(FunctionSpec(function_name(b), spec.inputs, spec.outputs)
                                     for b, (spec, _) in zip(buckets, specs)))
    program = _program("mil", ref)
    functions = {}
    for bucket, package, (spec, regions), scenario, arrays_path in zip(buckets, packages, specs, scenarios,
                                                                         parity_arrays):
        name = function_name(bucket)
        with np.load(arrays_path) as z:
            reference = {t.name: z[f"reference/{t.name}"] for t in spec.outputs}
            verified = {t.name: z[f"mil/{t.name}"] for t in spec.outputs}
        t0 = time.perf_counter()
        try:
            difference = function_difference(program.program, name, package_function(package))
        except MilLoadError as e:
            difference = str(e)
        if difference is None:  # the package's own outputs, already cut to the valid region
            valid_out, how = verified, {"same_program_as": str(package)}
        else:
            log.info("bundle %s: %s differs from %s (%s); running it", stage_name, name, package, difference)
            inputs = load_export_call(scenario, spec)[0]
            out = program.run(name, inputs)
            valid_out = {t.name: valid_part(np.asarray(out[t.name]).reshape(t.shape), regions.get(t.name))
                         for t in spec.outputs}
            how = {"ran": difference}
        scored = _score(spec, valid_out, reference, {}, gate)
        functions[bucket] = {"function": name, **scored, **how, "seconds": time.perf_counter() - t0}
    summary = {"stage": stage_name, "bundle": Path(bundle).name, "gate": asdict(gate),
               "passed": all(r["passed"] for r in functions.values()), "functions": functions,
               "provenance": provenance()}
    return write_verdict(summary, out_json, lambda r: f"bundle {stage_name}: functions "
                         f"{[b for b, f in r['functions'].items() if not f['passed']]} failed the parity gate")
