"""Gate basics shared by every check that writes a verdict (parity, bundle parity, compressed variants,
the compiled chain, end to end): score outputs on their valid part, judge them against a `Gate`, and
write the verdict so that nothing downstream sees a failed report where a passing one would be.
numpy only; compile and verify both use it, neither through the other.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from anetts.artifacts import atomic_outputs, clear_outputs, failed_report_path, write_json
from anetts.metrics import compare, exact_match_fraction
from anetts.options import Gate


class ParityError(RuntimeError):
    pass


def valid_part(array: np.ndarray, region: tuple[int, int] | None) -> np.ndarray:
    """The first `n` entries of `array` along `axis` for a region (axis, n); all of it for None
    (the valid part of an output or state that parity and top-1 compare)."""
    if region is None:
        return array
    axis, n = region
    return np.take(array, np.arange(n), axis=axis)


def score_outputs(function, outputs: dict, reference: dict, regions: dict) -> dict:
    """Every output of `function` against its reference on its valid region: {"outputs": {name:
    metrics}, "min_snr_db": the worst float output's SNR (None: no float output)}. An int32 output
    is scored by its exact fraction too (`verdict` gates it by that)."""
    per_output, worst = {}, None
    for t in function.outputs:
        ref = valid_part(reference[t.name], regions.get(t.name))
        got = valid_part(np.asarray(outputs[t.name]).reshape(reference[t.name].shape), regions.get(t.name))
        m = compare(ref, got)
        if t.dtype == "int32":
            m["exact_fraction"] = exact_match_fraction(ref, got)
        else:
            worst = m["snr_db"] if worst is None else min(worst, m["snr_db"])
        per_output[t.name] = m
    return {"outputs": per_output, "min_snr_db": worst}


def verdict(scored: dict, gate: Gate) -> dict:
    """{"passed", "meets_target"} of a `score_outputs` result: its worst SNR against the gate, and
    each exact fraction (int outputs) against `min_exact_fraction`."""
    worst = scored["min_snr_db"]
    exact_ok = all(m["exact_fraction"] >= gate.min_exact_fraction
                   for m in scored["outputs"].values() if "exact_fraction" in m)
    passed = exact_ok and (worst is None or worst >= gate.min_snr_db)
    return {"passed": bool(passed), "meets_target": bool(passed and (worst is None or worst >= gate.target_snr_db))}


def score(function, outputs: dict, reference: dict, regions: dict, gate: Gate) -> dict:
    """`score_outputs` and its `verdict` in one dict."""
    scored = score_outputs(function, outputs, reference, regions)
    return {**scored, **verdict(scored, gate)}


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


def write_checks_verdict(report: dict, out_json: Path, what: str) -> dict:
    """`write_verdict` for a report of named checks (`report["checks"]`): a failure names them."""
    return write_verdict(report, out_json, lambda r: f"{what} failed {sorted(k for k, ok in r['checks'].items() if not ok)}")


def gated(report: dict) -> dict:
    """The backends of a parity report that count towards its verdict (those with `passed`)."""
    return {n: b for n, b in report["backends"].items() if "passed" in b}


def describe_gate(report: dict) -> str:
    """A parity report's gate in words, from what it measured: `min X dB`, `exact >= Z` where an
    int output was scored, `top-1 >= Y` where a logits output was."""
    g, backends = report["gate"], gated(report).values()
    parts = [f"min {g['min_snr_db']} dB"]
    if any("exact_fraction" in m for b in backends for m in b.get("outputs", {}).values()):
        parts.append(f"exact >= {g['min_exact_fraction']}")
    if any(b.get("top1") for b in backends):
        parts.append(f"top-1 >= {g['min_top1']}")
    return ", ".join(parts)
