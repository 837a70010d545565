"""Parity of one package at one bucket: the package plays its export's scenario (the state carried
from call to call), every call scored against the outputs the export expects on its valid region;
logits also by top-1 agreement wherever the stage declares them. A Kokoro bucket's scenario is one
call on its example inputs, a Fish AR stage's upstream's teacher-forced calls: one path for both.

Backends: the MIL reference executor everywhere, Core ML beside it on macOS (states need macOS 15),
or a Core AI asset on Apple's runtime (`anetts.verify.aimodel_parity`); every program runs through
the runners of :mod:`anetts.runtime.runners`. The torch figure (traced vs eager, or the eager wrapper
vs upstream) comes from the export report, so parity needs no family, no model and no torch.

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
from typing import Mapping, Sequence

import numpy as np

from anetts.gate import ParityError, describe_gate, gated, score, valid_part, verdict, write_verdict
from anetts.metrics import compare, logit_rows, top1_agreement
from anetts.mil.compare import function_difference, package_function
from anetts.mil.errors import MilLoadError
from anetts.options import Gate
from anetts.provenance import provenance
from anetts.runtime.errors import ArtifactError
from anetts.runtime.runners import PackageRef, load_program
from anetts.scenario import STATE, Call, Scenario, load_scenario, positions
from anetts.tensors import FunctionSpec, function_name

log = logging.getLogger(__name__)


def _program(executor: str, ref: PackageRef):
    try:
        return load_program(executor, ref)
    except ArtifactError as e:
        raise ParityError(f"{ref.path}: {e}") from e


def _macos_version() -> tuple[int, ...] | None:
    if sys.platform != "darwin":
        return None
    import platform

    return tuple(int(x) for x in platform.mac_ver()[0].split(".")[:2] if x.isdigit()) or None


# ------------------------------------------------------------------------------ the engine
def _score_call(scenario: Scenario, i: int, outputs: Mapping[str, np.ndarray], states: Mapping[str, np.ndarray] | None,
                reference: Mapping[str, np.ndarray], gate: Gate, gate_states: bool) -> dict:
    c = scenario.calls[i]
    fn = scenario.functions[c.function]
    missing = [t.name for t in fn.outputs if t.name not in reference]
    if missing:
        raise ParityError(f"scenario {scenario.name}: call {i} reference lacks outputs {missing}")
    scored = score(fn, outputs, reference, dict(c.valid), gate)
    scored_states = {}
    if states is not None:
        for name, region in c.state_valid.items():
            key = STATE + name
            if key not in reference:
                raise ParityError(f"scenario {scenario.name}: call {i} reference lacks {key}")
            ref = valid_part(np.asarray(reference[key], np.float32), tuple(region))
            got = valid_part(np.asarray(states[name], np.float32), tuple(region))
            scored_states[name] = compare(ref, got)
    worst = scored["min_snr_db"]
    passed = scored["passed"]
    if gate_states and scored_states:
        s_worst = min(m["snr_db"] for m in scored_states.values())
        worst = s_worst if worst is None else min(worst, s_worst)
        passed = passed and s_worst >= gate.min_snr_db
    return {"call": i, "function": c.function, "outputs": scored["outputs"], "states": scored_states,
            "min_snr_db": worst, "passed": bool(passed),
            "meets_target": bool(passed and (worst is None or worst >= gate.target_snr_db))}


def _run_backend(scenario: Scenario, reference, gate: Gate, gate_states: bool, program,
                 keep_outputs: Sequence[str] = (), rename: Mapping[str, str] | None = None) -> dict:
    """Play every call on one runner's program, the state carried, and score each. `rename`: the
    package's name of a scenario function (a bucket's `main` in a bundle or a Core AI asset)."""
    rename = rename or {}
    state = program.new_state(rename.get(scenario.calls[0].function, scenario.calls[0].function)) \
        if scenario.states else None
    calls, seconds, kept, outputs = [], 0.0, {name: [] for name in keep_outputs}, {}
    for i, c in enumerate(scenario.calls):
        t0 = time.perf_counter()
        outputs = program.run(rename.get(c.function, c.function), c.inputs, state)
        seconds += time.perf_counter() - t0
        states = program.read_states(state) if state is not None else None
        calls.append(_score_call(scenario, i, outputs, states, reference[i], gate, gate_states))
        for name in keep_outputs:
            if name in outputs:  # (call, value): functions of a package return different outputs
                kept[name].append((i, np.asarray(outputs[name])))
    worst = [r["min_snr_db"] for r in calls if r["min_snr_db"] is not None]
    return {"calls": calls, "min_snr_db": min(worst) if worst else None,
            "passed": all(r["passed"] for r in calls),
            "meets_target": all(r["meets_target"] for r in calls), "seconds": round(seconds, 4),
            # not JSON: the caller scores and drops them
            "_outputs": kept, "_last": outputs}


def run_scenario(package: Path, scenario: Scenario, reference: Sequence[Mapping[str, np.ndarray]], gate: Gate,
                 gate_states: bool = True, compute_units: str = "CPU_AND_GPU", keep_outputs: Sequence[str] = (),
                 executor: str = "mil", rename: Mapping[str, str] | None = None) -> dict:
    """Play the scenario on the package with one state carried through all calls; score each call.

    `executor`: ``mil`` runs the .mlpackage (and Core ML beside it on macOS; states need macOS 15),
    ``coreai`` runs `package` as a Core AI asset. `gate_states`: the states' valid regions count
    towards the gate, not only the outputs. `keep_outputs`: per backend, every call's value of these
    outputs under `_outputs` (e.g. logits, for top-1 agreement); `_last`: the last call's outputs.
    """
    if len(reference) != len(scenario.calls):
        raise ParityError(f"scenario {scenario.name}: {len(reference)} references for {len(scenario.calls)} calls")
    rename = dict(rename or {})
    used = dict.fromkeys(c.function for c in scenario.calls)  # the package may have functions the calls skip
    functions = tuple(FunctionSpec(rename.get(n, n), f.inputs, f.outputs, f.states)
                      for n, f in ((n, scenario.functions[n]) for n in used))
    ref = PackageRef(label=f"{Path(package).name} (scenario {scenario.name})", path=Path(package),
                     functions=functions, function=functions[0].name, compute_units=compute_units,
                     aimodel=Path(package) if executor == "coreai" else None)

    def play(name: str) -> dict:
        return _run_backend(scenario, reference, gate, gate_states, _program(name, ref), keep_outputs, rename)

    backends = {executor: play(executor)}
    if executor == "mil":  # Core ML runs the same package where it can
        macos = _macos_version()
        if macos is not None and (macos >= (15, 0) or not scenario.states):
            backends["coreml"] = {**play("coreml"), "compute_units": compute_units}
        elif macos is not None:
            backends["coreml"] = {"skipped": f"Core ML states need macOS 15 (this is {'.'.join(map(str, macos))})"}
        else:
            backends["coreml"] = {"skipped": f"CoreML predict needs macOS (this is {sys.platform})"}
    return {"scenario": scenario.name, "package": str(package), "gate": asdict(gate), "gate_states": gate_states,
            "calls": [{"function": c.function, "valid": {k: list(v) for k, v in c.valid.items() if v is not None},
                       "state_valid": {k: list(v) for k, v in c.state_valid.items()}} for c in scenario.calls],
            "backends": backends, "passed": all(b["passed"] for b in gated({"backends": backends}).values()),
            "provenance": provenance()}


def per_call_db(report: dict, backend: str = "mil") -> list[float | None]:
    """The worst gated SNR (dB) of each call, in call order."""
    return [r["min_snr_db"] for r in report["backends"][backend]["calls"]]


def check_scenario(report: dict, out_json: Path) -> dict:
    """`run_scenario`'s report written if every call of every backend passed; else `.failed.json` and raise."""
    def why(r: dict) -> str:
        bad = {name: [(c["call"], c["function"], c["min_snr_db"]) for c in b["calls"] if not c["passed"]]
               for name, b in gated(r).items() if not b["passed"]}
        return f"scenario {r['scenario']} failed its parity gate (min {r['gate']['min_snr_db']} dB) at (call, function, dB) {bad}"

    for b in report["backends"].values():
        b.pop("_outputs", None), b.pop("_last", None)
    return write_verdict(report, out_json, why)


# ------------------------------------------------------------------------------ a package's parity report
def _top1(b: dict, logits: list[str], scenario: Scenario, expected: list, gate: Gate) -> dict:
    """Per logits output: agreement over each call's valid rows (a padded prefill block's are not),
    the rows compared and the calls with a mismatch; gated by `Gate.min_top1`."""
    kept, top1 = b["_outputs"], {}
    for out in logits:
        calls = [i for i, _ in kept[out]]
        regions = [scenario.calls[i].valid.get(out) for i in calls]
        want_calls = [valid_part(np.asarray(expected[i][out]), r) for i, r in zip(calls, regions)]
        got_calls = [valid_part(np.asarray(v).reshape(np.shape(expected[i][out])), r)
                     for (i, v), r in zip(kept[out], regions)]
        want, got = logit_rows(want_calls), logit_rows(got_calls)
        call_of_row = np.repeat(calls, [c.size // want.shape[-1] for c in want_calls])
        agree = top1_agreement(want, got)
        top1[out] = {"agreement": agree, "positions": len(want), "mismatch_calls": sorted(
            {int(call_of_row[r]) for r in np.flatnonzero(want.argmax(-1) != got.argmax(-1))})}
        b["passed"] = bool(b["passed"] and agree >= gate.min_top1)
    return top1


def _worst_call_outputs(calls: list[dict]) -> dict:
    """Each output's metrics at the call where it scored worst (every function's, in call order)."""
    out = {}
    for r in calls:
        for t, m in r["outputs"].items():
            if t not in out or m["snr_db"] < out[t]["snr_db"]:
                out[t] = m
    return out


def _compact_calls(calls: list[dict], pos: list[int]) -> list[dict]:
    return [{"call": r["call"], "function": r["function"], "pos": p, "min_snr_db": r["min_snr_db"],
             "outputs_snr_db": {k: v["snr_db"] for k, v in r["outputs"].items()},
             "states_min_snr_db": min((v["snr_db"] for v in r["states"].values()), default=None),
             "passed": r["passed"]} for r, p in zip(calls, pos)]


def _torch_backend(export: dict, gate: Gate) -> dict:
    """The export's torch figure as a backend. Traced vs eager is gated here like the package;
    the eager wrapper vs upstream was gated at export (its `gate_db`) and is reported."""
    t = export["torch"]
    b = {"min_snr_db": t["min_snr_db"], "outputs": t["outputs"],
         "top1": {k: {"agreement": v} for k, v in t["top1"].items()}}
    if "gate_db" not in t:
        b.update(verdict(t, gate))
        b["passed"] = bool(b["passed"] and all(v >= gate.min_top1 for v in t["top1"].values()))
    return {**b, "seconds": export["seconds"]["torch_scenario"]}


def run_parity(package: Path, scenario_npz: Path, export_report: Path, gate: Gate, compute_units: str = "CPU_AND_GPU",
               executor: str = "mil", rename: Mapping[str, str] | None = None) -> dict:
    """The package (`executor`: ``mil`` an .mlpackage, ``coreai`` a Core AI asset) against its export:
    its scenario played and scored, logits by top-1, and the export's torch figure beside it.
    `rename`: {scenario function: the package's}, e.g. a bucket's `main` as an asset's `t48`."""
    export = json.loads(Path(export_report).read_text(encoding="utf-8"))
    scenario, expected = load_scenario(scenario_npz)
    logits = list(export["logits_outputs"])
    rep = run_scenario(package, scenario, expected, gate, compute_units=compute_units, keep_outputs=logits,
                       executor=executor, rename=rename)
    pos = positions(scenario)
    last = scenario.calls[-1]
    arrays = {"positions": np.asarray(pos)}
    # the last call's valid outputs, reference and package, for the summary's plots and bundle parity
    for t in scenario.functions[last.function].outputs:
        arrays[f"reference/{t.name}"] = valid_part(np.asarray(expected[-1][t.name]), last.valid.get(t.name))
    for name, b in rep["backends"].items():
        if "calls" not in b:
            continue
        b["top1"] = _top1(b, logits, scenario, expected, gate)
        b["outputs"] = _worst_call_outputs(b["calls"])
        arrays[f"{name}/per_call_db"] = np.asarray([np.nan if r["min_snr_db"] is None else r["min_snr_db"]
                                                    for r in b["calls"]])
        if name == executor:
            for t in scenario.functions[last.function].outputs:
                got = np.asarray(b["_last"][t.name]).reshape(np.shape(expected[-1][t.name]))
                arrays[f"{name}/{t.name}"] = valid_part(got, last.valid.get(t.name))
        b.pop("_outputs"), b.pop("_last")
        b["calls"] = _compact_calls(b["calls"], pos)
    torch_s = export["seconds"]["torch_scenario"]
    backends = {"torch_trace": _torch_backend(export, gate), **rep["backends"]}
    return {
        "stage": export["stage"],
        "bucket": export["bucket"],
        "function": (rename or {}).get(scenario.calls[0].function, scenario.calls[0].function),
        "scenario": scenario.name,
        "gate": asdict(gate),
        "calls": len(scenario.calls),
        "calls_per_function": export["calls_per_function"],
        "positions_checked": [min(pos), max(pos)],
        "valid_regions": {k: list(v) for k, v in last.valid.items() if v is not None},
        # torch's time for the same scenario on this machine (the traced replay, or the eager calls)
        "torch_seconds": torch_s,
        f"{executor}_vs_torch_time_ratio": rep["backends"][executor]["seconds"] / torch_s if torch_s else None,
        "backends": backends,
        "passed": all(b["passed"] for b in gated({"backends": backends}).values()),
        "provenance": provenance(),
        "_arrays": arrays,
    }


def _why_failed(report: dict) -> str:
    bad = {}
    for name, b in gated(report).items():
        if b["passed"]:
            continue
        bad[name] = {"min_snr_db": b.get("min_snr_db")}
        calls = [(c["call"], c["function"], c["pos"], c["min_snr_db"]) for c in b.get("calls", []) if not c["passed"]]
        if len(b.get("calls", [])) > 1:
            bad[name].update({"failed calls (call, function, pos, dB)": calls[:8], "failed": len(calls)})
        if b.get("top1"):
            bad[name]["top1"] = {k: v["agreement"] for k, v in b["top1"].items()}
    return f"{report['stage']}/{report['bucket']} failed its parity gate ({describe_gate(report)}): {bad}"


def check_parity(report: dict, out_json: Path, out_arrays: Path | None = None) -> dict:
    """Write the report (and its arrays) where downstream rules find them only if it passed; otherwise raise."""
    arrays = report.pop("_arrays", {})
    write_verdict(report, Path(out_json), _why_failed, arrays, out_arrays)
    for name, b in gated(report).items():
        if b["passed"] and not b.get("meets_target", True):
            log.warning("%s/%s %s: %.1f dB is below the %.0f dB target", report["stage"], report["bucket"], name,
                        b["min_snr_db"], report["gate"]["target_snr_db"])
    return report


def one_call(scenario_npz: Path) -> Call:
    """The one call of a one-call export (a bucket a bundle or a Core AI asset is made of)."""
    scenario, _ = load_scenario(scenario_npz)
    if len(scenario.calls) != 1:
        raise ParityError(f"{scenario_npz}: {len(scenario.calls)} calls; expected an export of one call")
    return scenario.calls[0]


def check_bundle_parity(stage_name: str, buckets: list[str], bundle: Path, packages: list, export_reports: list,
                        scenarios: list, parity_arrays: list, gate: Gate, out_json: Path) -> dict:
    """Every function of a multifunction bundle through its bucket's gate; all must pass.

    A function that is its verified package's program again (`anetts.mil.compare`: the same ops on
    the same values, no op that an opset change alters) computes the package's outputs, which its
    `parity` job stored: those are scored, and the function is not run. Any other function runs
    on the executor. The reference is the eager output already stored by each bucket's `parity`
    job either way, so the bundle needs no second eager run.
    """
    specs = [FunctionSpec.from_json(json.loads(Path(p).read_text(encoding="utf-8"))["functions"][0])
             for p in export_reports]
    ref = PackageRef(label=f"bundle {stage_name}", path=Path(bundle), function=function_name(buckets[0]),
                     functions=tuple(FunctionSpec(function_name(b), fn.inputs, fn.outputs)
                                     for b, fn in zip(buckets, specs)))
    program = _program("mil", ref)
    functions = {}
    for bucket, package, fn, scenario, arrays_path in zip(buckets, packages, specs, scenarios, parity_arrays):
        name = function_name(bucket)
        with np.load(arrays_path) as z:
            reference = {t.name: z[f"reference/{t.name}"] for t in fn.outputs}
            verified = {t.name: z[f"mil/{t.name}"] for t in fn.outputs}
        t0 = time.perf_counter()
        try:
            difference = function_difference(program.program, name, package_function(package))
        except MilLoadError as e:
            difference = str(e)
        if difference is None:  # the package's own outputs, already cut to the valid region
            valid_out, how = verified, {"same_program_as": str(package)}
        else:
            log.info("bundle %s: %s differs from %s (%s); running it", stage_name, name, package, difference)
            call = one_call(scenario)
            out = program.run(name, dict(call.inputs))
            valid_out = {t.name: valid_part(np.asarray(out[t.name]).reshape(t.shape), call.valid.get(t.name))
                         for t in fn.outputs}
            how = {"ran": difference}
        scored = score(fn, valid_out, reference, {}, gate)
        functions[bucket] = {"function": name, **scored, **how, "seconds": time.perf_counter() - t0}
    summary = {"stage": stage_name, "bundle": Path(bundle).name, "gate": asdict(gate),
               "passed": all(r["passed"] for r in functions.values()), "functions": functions,
               "provenance": provenance()}
    return write_verdict(summary, out_json, lambda r: f"bundle {stage_name}: functions "
                         f"{[b for b, f in r['functions'].items() if not f['passed']]} failed the parity gate")
