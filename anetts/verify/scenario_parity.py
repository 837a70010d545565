"""Parity of a scenario stage at one bucket: the package plays the export's teacher-forced scenario
(state carried), every call scored against upstream's tensors; logits also by top-1 agreement.

Gated per call (`Gate.min_snr_db` on outputs and on the states' written rows) and over the
scenario (`Gate.min_top1` for each logits output). The report names the positions checked. Like
`anetts.verify.parity`, it needs neither the family nor torch.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

import numpy as np

from anetts.options import Gate
from anetts.provenance import provenance
from anetts.verify.metrics import logit_rows, top1_agreement
from anetts.verify.parity import valid_part, write_verdict
from anetts.verify.scenario import load_scenario, run_scenario

log = logging.getLogger(__name__)


def _compact_calls(backend: dict, positions: list[int]) -> list[dict]:
    return [{"call": r["call"], "function": r["function"], "pos": p, "min_snr_db": r["min_snr_db"],
             "outputs_snr_db": {k: v["snr_db"] for k, v in r["outputs"].items()},
             "states_min_snr_db": min((v["snr_db"] for v in r["states"].values()), default=None),
             "passed": r["passed"]} for r, p in zip(backend["calls"], positions)]


def run_scenario_parity(package: Path, scenario_npz: Path, export_report: Path, gate: Gate,
                        compute_units: str = "CPU_AND_GPU") -> dict:
    export = json.loads(Path(export_report).read_text(encoding="utf-8"))
    scenario, expected = load_scenario(scenario_npz)
    logits = list(export.get("logits_outputs", []))
    rep = run_scenario(package, scenario, expected, gate, compute_units=compute_units, keep_outputs=logits)
    positions = [int(c.inputs["pos"][0]) if "pos" in c.inputs else i for i, c in enumerate(scenario.calls)]
    arrays = {"positions": np.asarray(positions)}
    for name, b in rep["backends"].items():
        if "calls" not in b:
            continue
        kept = b.pop("_outputs", {})
        b["top1"] = {}
        for out in logits:  # over each call's valid rows (a padded prefill block's are not)
            calls = [i for i, _ in kept[out]]
            regions = [scenario.calls[i].valid.get(out) for i in calls]
            want_calls = [valid_part(np.asarray(expected[i][out]), r) for i, r in zip(calls, regions)]
            got_calls = [valid_part(np.asarray(v).reshape(np.shape(expected[i][out])), r)
                         for (i, v), r in zip(kept[out], regions)]
            want, got = logit_rows(want_calls), logit_rows(got_calls)
            call_of_row = np.repeat(calls, [c.size // want.shape[-1] for c in want_calls])
            agree = top1_agreement(want, got)
            b["top1"][out] = {"agreement": agree, "positions": len(want), "mismatch_calls": sorted(
                {int(call_of_row[r]) for r in np.flatnonzero(want.argmax(-1) != got.argmax(-1))})}
            b["passed"] = bool(b["passed"] and agree >= gate.min_top1)
        names = dict.fromkeys(t for r in b["calls"] for t in r["outputs"])  # every function's, in call order
        b["outputs"] = {t: {"snr_db": min(r["outputs"][t]["snr_db"] for r in b["calls"] if t in r["outputs"])}
                        for t in names}
        arrays[f"{name}/per_call_db"] = np.asarray([np.nan if r["min_snr_db"] is None else r["min_snr_db"]
                                                    for r in b["calls"]])
        b["calls"] = _compact_calls(b, positions)
    gated = [b for b in rep["backends"].values() if "passed" in b]
    torch_s = export["seconds"].get("eager_scenario")  # the eager wrapper's calls, the same scenario
    mil_s = rep["backends"]["mil"]["seconds"]
    upstream_db = export["eager_vs_upstream"]["min_snr_db"]
    return {
        "kind": "scenario",
        "stage": export["stage"],
        "bucket": export["bucket"],
        "function": "scenario",
        "scenario": rep["scenario"],
        "gate": asdict(gate),
        "calls": len(scenario.calls),
        "calls_per_function": export["calls_per_function"],
        "positions_checked": [min(positions), max(positions)],
        "torch_seconds": torch_s,
        "mil_vs_torch_time_ratio": mil_s / torch_s if torch_s else None,
        "backends": {
            # the fp32 wrapper against upstream (checked at export): what tracing starts from
            "torch_trace": {"min_snr_db": min(upstream_db.values()), "outputs": {k: {"snr_db": v} for k, v in upstream_db.items()},
                            "top1": export["eager_vs_upstream"].get("top1", {})},
            **rep["backends"],
        },
        "passed": all(b["passed"] for b in gated),
        "provenance": provenance(),
        "_arrays": arrays,
    }


def check_scenario_parity(report: dict, out_json: Path, out_arrays: Path) -> dict:
    """Write the report and arrays only if every backend passed; else a `.failed.json` and raise."""
    arrays = report.pop("_arrays", {})
    write_verdict(report, out_json, _why_failed, arrays, out_arrays)
    for name, b in report["backends"].items():
        if b.get("passed") and not b.get("meets_target", True):
            log.warning("%s/%s %s: %.1f dB is below the %.0f dB target", report["stage"], report["bucket"], name,
                        b["min_snr_db"], report["gate"]["target_snr_db"])
    return report


def _why_failed(report: dict) -> str:
    bad = {}
    for name, b in report["backends"].items():
        if "passed" in b and not b["passed"]:
            calls = [(c["call"], c["function"], c["pos"], c["min_snr_db"]) for c in b["calls"] if not c["passed"]]
            bad[name] = {"failed calls (call, function, pos, dB)": calls[:8], "failed": len(calls),
                         "top1": {k: v["agreement"] for k, v in b.get("top1", {}).items()}}
    return (f"{report['stage']}/{report['bucket']} failed its scenario gate (min {report['gate']['min_snr_db']} dB, "
            f"top-1 >= {report['gate']['min_top1']}): {bad}")
