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

import numpy as np

from anetts.artifacts import atomic_outputs, write_json
from anetts.options import Gate  # noqa: F401 - re-exported
from anetts.provenance import provenance
from anetts.stage import BucketSpec, FunctionSpec
from anetts.verify.metrics import compare, exact_match_fraction

log = logging.getLogger(__name__)


class ParityError(RuntimeError):
    pass


def _valid(array: np.ndarray, region: tuple[int, int] | None) -> np.ndarray:
    if region is None:
        return array
    axis, n = region
    return np.take(array, np.arange(n), axis=axis)


def _score(spec, outputs: dict, reference: dict, regions: dict, gate: Gate) -> dict:
    per_output, worst, exact_ok = {}, None, True
    for t in spec.outputs:
        ref = _valid(reference[t.name], regions.get(t.name))
        got = _valid(np.asarray(outputs[t.name]).reshape(reference[t.name].shape), regions.get(t.name))
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


def load_export_outputs(path: Path, spec) -> tuple[dict, dict]:
    """(eager reference, traced outputs) stored by the export job for these example inputs."""
    with np.load(path) as z:
        missing = [f"{k}/{t.name}" for k in ("eager", "traced") for t in spec.outputs if f"{k}/{t.name}" not in z.files]
        if missing:
            raise ParityError(f"{path}: export outputs lack {missing}; re-run the export")
        return ({t.name: z[f"eager/{t.name}"] for t in spec.outputs},
                {t.name: z[f"traced/{t.name}"] for t in spec.outputs})


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


def run_parity(package: Path, example_inputs: Path, export_outputs: Path, export_report: Path, gate: Gate,
               compute_units: str = "CPU_AND_GPU", function_name: str | None = None, executor: str = "mil") -> dict:
    """Score the package (and the traced export) against the eager fp32 outputs of the export job.

    The export job ran the eager wrapper and the traced module on these example inputs and
    stored both, with the bucket's spec and valid regions, so parity needs no family, no model
    and no torch.jit: one executor run per package. `executor`: ``mil`` runs the .mlpackage `package`
    (and Core ML beside it on macOS); ``coreai`` runs `package` as a Core AI asset.
    """
    from anetts.runtime.runners import PackageRef

    spec, regions, seconds = read_export_report(export_report)
    stage_name = spec.stage
    with np.load(example_inputs) as z:
        inputs = {k: z[k] for k in z.files}
    reference, traced_out = load_export_outputs(export_outputs, spec)
    eager_s, traced_s = seconds.get("eager_forward"), seconds.get("traced_forward")
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
        arrays[f"reference/{t.name}"] = _valid(reference[t.name], region)
        arrays[f"{executor}/{t.name}"] = _valid(np.asarray(out[t.name]).reshape(reference[t.name].shape), region)
    return {
        "stage": stage_name,
        "bucket": spec.bucket,
        "function": fn.name,
        "gate": asdict(gate),
        "valid_regions": {k: list(v) for k, v in regions.items() if v is not None},
        "eager_seconds": eager_s,
        f"{executor}_vs_eager_time_ratio": out_s / eager_s if eager_s else None,
        "backends": backends,
        "passed": all(b["passed"] for b in gated),
        "provenance": provenance(),
        "_arrays": arrays,
    }


def check_parity(report: dict, out_json: Path, out_arrays: Path | None = None) -> dict:
    """Write the report where downstream rules find it only if it passed; otherwise raise."""
    out_json = Path(out_json)
    arrays = report.pop("_arrays", {})
    if report["passed"]:
        outs = (out_json,) if out_arrays is None else (out_json, Path(out_arrays))
        with atomic_outputs(*outs) as tmps:
            write_json(tmps[0], report)
            if out_arrays is not None:
                with open(tmps[1], "wb") as f:
                    np.savez_compressed(f, **arrays)
        for name, b in report["backends"].items():
            if b.get("passed") and not b.get("meets_target"):
                log.warning("%s/%s %s: %.1f dB is below the %.0f dB target", report["stage"], report["bucket"], name,
                            b["min_snr_db"], report["gate"]["target_snr_db"])
        return report
    failed = out_json.with_name(out_json.stem + ".failed.json")
    write_json(failed, report)
    worst = {n: b.get("min_snr_db") for n, b in report["backends"].items() if "passed" in b and not b["passed"]}
    raise ParityError(f"{report['stage']}/{report['bucket']} failed its parity gate "
                      f"(min {report['gate']['min_snr_db']} dB): {worst}; report: {failed}")


def check_bundle_parity(stage_name: str, buckets: list[str], bundle: Path, export_reports: list, example_inputs: list,
                        reference_arrays: list, gate: Gate, out_json: Path) -> dict:
    """Every function of a multifunction bundle through the per-bucket gate; all must pass.

    The reference is the upstream eager output already stored by each bucket's `parity` job, so
    the bundle costs one executor run per function and no second eager run.
    """
    from anetts.compile.bundle import function_name
    from anetts.runtime.runners import PackageRef

    specs = [read_export_report(p)[:2] for p in export_reports]
    ref = PackageRef(label=f"bundle {stage_name}", path=Path(bundle), function=function_name(buckets[0]),
                     functions=tuple(FunctionSpec(function_name(b), spec.inputs, spec.outputs)
                                     for b, (spec, _) in zip(buckets, specs)))
    program = _program("mil", ref)
    functions = {}
    for bucket, (spec, regions), inputs_path, ref_path in zip(buckets, specs, example_inputs, reference_arrays):
        with np.load(inputs_path) as z:
            inputs = {k: z[k] for k in z.files}
        with np.load(ref_path) as z:
            reference = {t.name: z[f"reference/{t.name}"] for t in spec.outputs}
        out, seconds = _timed(lambda: program.run(function_name(bucket), inputs))
        valid_out = {t.name: _valid(np.asarray(out[t.name]).reshape(t.shape), regions.get(t.name)) for t in spec.outputs}
        scored = _score(spec, valid_out, reference, {}, gate)
        functions[bucket] = {"function": function_name(bucket), **scored, "seconds": seconds}
    summary = {"stage": stage_name, "bundle": Path(bundle).name, "gate": asdict(gate),
               "passed": all(r["passed"] for r in functions.values()), "functions": functions,
               "provenance": provenance()}
    if not summary["passed"]:
        failed = Path(out_json).with_name(Path(out_json).stem + ".failed.json")
        write_json(failed, summary)
        bad = [b for b, r in functions.items() if not r["passed"]]
        raise ParityError(f"bundle {stage_name}: functions {bad} failed the parity gate; report: {failed}")
    with atomic_outputs(out_json) as (tmp,):
        write_json(tmp, summary)
    return summary
