"""Stateful parity: a *scenario* is a sequence of calls (e.g. prefill, then k decode steps) with
the package's state carried from one call to the next, each call scored against the upstream
eager run of the same calls on its valid region.

A single-call parity cannot see state bugs: a KV cache written at the wrong position, or read
before it is written, only shows in the calls after it.  So the eager module runs the same
calls in order, its buffers playing the state (zero-filled first, as Core ML's `makeState()`
allocates them), and every call's outputs (and, where a region is given, the state's valid
part: the cache rows written so far) go through the parity gate (`anetts.verify.parity.Gate`).

The eager references are recorded once (`record_eager`, the only part that needs torch) and can
be stored with the inputs (`save_scenario`), so scoring a package (`run_scenario`) loads neither
the model nor TorchScript, like `anetts.verify.parity`.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from anetts.artifacts import atomic_outputs
from anetts.provenance import provenance
from anetts.stage import FunctionSpec
from anetts.verify.metrics import compare
from anetts.verify.parity import Gate, ParityError, _score, valid_part, write_verdict

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Call:
    """One call of a scenario: which function, its inputs, and what of its results is valid.

    `valid`: per output, (axis, length) of the valid part (absent or None: all of it).
    `state_valid`: per state, (axis, length) of the part the calls so far have written; states
    not named here are not compared (their unwritten part is zeros in Core ML and whatever the
    module's buffer held in eager)."""

    function: str
    inputs: Mapping[str, np.ndarray]
    valid: Mapping[str, tuple[int, int] | None] = field(default_factory=dict)
    state_valid: Mapping[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    name: str
    functions: Mapping[str, FunctionSpec]  # every function the calls use, by name
    calls: tuple[Call, ...]

    def __post_init__(self):
        if not self.calls:
            raise ValueError(f"scenario {self.name}: no calls")
        states = None
        for i, c in enumerate(self.calls):
            if c.function not in self.functions:
                raise ValueError(f"scenario {self.name}: call {i} uses unknown function {c.function!r}; "
                                 f"functions: {sorted(self.functions)}")
            fn = self.functions[c.function]
            for t in fn.inputs:
                if t.name not in c.inputs:
                    raise ValueError(f"scenario {self.name}: call {i} ({c.function}) lacks input {t.name!r}")
                t.check(np.asarray(c.inputs[t.name]), f"scenario {self.name} call {i} ({c.function})")
            extra = sorted(set(c.inputs) - {t.name for t in fn.inputs})
            if extra:
                raise ValueError(f"scenario {self.name}: call {i} ({c.function}) has unknown inputs {extra}")
            unknown = sorted(set(c.state_valid) - {t.name for t in fn.states})
            if unknown:
                raise ValueError(f"scenario {self.name}: call {i} ({c.function}) names unknown states {unknown}")
            key = tuple((t.name, t.shape, t.dtype) for t in fn.states)
            if states is not None and key != states:
                # one state object flows through every call, so every function must declare it alike
                raise ValueError(f"scenario {self.name}: function {c.function!r} declares other states "
                                 f"than the calls before it")
            states = key

    @property
    def states(self):
        return self.functions[self.calls[0].function].states

    def to_json(self) -> dict:
        return {"name": self.name, "functions": {k: f.to_json() for k, f in self.functions.items()},
                "calls": [{"function": c.function, "valid": {k: list(v) for k, v in c.valid.items() if v is not None},
                           "state_valid": {k: list(v) for k, v in c.state_valid.items()}} for c in self.calls]}


# ------------------------------------------------------------------------------ eager side
_STATE = "state/"  # a reference's key for a state, before its name
_ROWS = "eager_rows/state/"  # in the file: per call and state, the rows it changed (`save_scenario`)


def record_eager(module, scenario: Scenario) -> list[dict[str, np.ndarray]]:
    """Run the calls on the eager torch `module` in order; per call, its outputs and states.

    `module.forward` takes the function's inputs in spec order (whatever function a call
    names: one module serves every entry point, as one set of weights does in the package) and
    updates the state buffers (`register_buffer` named like the states) in place.  The buffers
    are zeroed first, because Core ML allocates states zero-filled.  Returns, per call,
    `{output name: array, "state/<name>": array}` in float32 / int32.
    """
    import torch

    buffers = dict(module.named_buffers())
    missing = [t.name for t in scenario.states if t.name not in buffers]
    if missing:
        raise ValueError(f"scenario {scenario.name}: the module has no buffers {missing}; "
                         f"buffers: {sorted(buffers)}")
    out = []
    with torch.no_grad():
        for t in scenario.states:
            buffers[t.name].zero_()
        for c in scenario.calls:
            fn = scenario.functions[c.function]
            args = tuple(torch.from_numpy(np.ascontiguousarray(c.inputs[t.name])) for t in fn.inputs)
            res = module(*args)
            res = res if isinstance(res, tuple) else (res,)
            if len(res) != len(fn.outputs):
                raise ValueError(f"scenario {scenario.name}: {c.function} returned {len(res)} outputs, "
                                 f"its spec has {len(fn.outputs)}")
            rec = {t.name: r.detach().cpu().numpy().astype(t.np_dtype) for t, r in zip(fn.outputs, res)}
            for t in fn.states:
                rec[_STATE + t.name] = buffers[t.name].detach().cpu().float().numpy().copy()
            out.append(rec)
    return out


def _rows_like(prev: np.ndarray | None, now: np.ndarray, axis: int) -> np.ndarray:
    """`prev` (None: zeros) as an array of `now`'s shape: a reference may hold only a state's
    compared region (as `load_scenario` gives it back), which grows from call to call."""
    if prev is not None and prev.shape == now.shape:
        return prev
    out = np.zeros_like(now)
    if prev is not None:
        n = min(prev.shape[axis], now.shape[axis])
        out[(slice(None),) * axis + (slice(0, n),)] = np.take(prev, np.arange(n), axis=axis)
    return out


def save_scenario(path: Path, scenario: Scenario, reference: Sequence[Mapping[str, np.ndarray]],
                  traced: Sequence[Mapping[str, np.ndarray]] | None = None) -> None:
    """Inputs, regions and eager references in one .npz (atomic), for `load_scenario`; `traced`:
    per call, the traced module's outputs too (`load_traced`).

    A state is kept only where a call compares it (`state_valid`), and as what the call changed:
    along the region's axis, the rows that differ from the state after the previous call (zeros
    before the first, as Core ML allocates states), with their indices. Each call writes a few
    rows, so a 4-layer S2 Pro chunk's 146 calls keep megabytes instead of 4.9 GB of whole caches;
    `load_scenario` rebuilds every call's state exactly."""
    if len(reference) != len(scenario.calls) or (traced is not None and len(traced) != len(scenario.calls)):
        raise ValueError(f"scenario {scenario.name}: references for {len(reference)} calls"
                         f"{'' if traced is None else f' and traced outputs for {len(traced)}'}, "
                         f"but {len(scenario.calls)} calls")
    arrays = {"__scenario__": np.array(json.dumps(scenario.to_json()))}
    before: dict[str, np.ndarray] = {}
    for i, (c, ref) in enumerate(zip(scenario.calls, reference)):
        arrays.update({f"call{i}/input/{k}": np.asarray(v) for k, v in c.inputs.items()})
        arrays.update({f"call{i}/eager/{k}": np.asarray(v) for k, v in ref.items() if not k.startswith(_STATE)})
        for name, (axis, _) in c.state_valid.items():
            now = np.asarray(ref[_STATE + name])
            prev = _rows_like(before.get(name), now, axis)
            others = tuple(a for a in range(now.ndim) if a != axis)
            rows = np.flatnonzero(np.any(now != prev, axis=others)).astype(np.int32)
            arrays[f"call{i}/{_ROWS}{name}/index"] = rows
            arrays[f"call{i}/{_ROWS}{name}/values"] = np.take(now, rows, axis=axis)
            before[name] = now
        if traced is not None:
            arrays.update({f"call{i}/traced/{k}": np.asarray(v) for k, v in traced[i].items()})
    with atomic_outputs(Path(path)) as (tmp,):
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)


def load_scenario(path: Path) -> tuple[Scenario, list[dict[str, np.ndarray]]]:
    """The scenario and, per call, its eager references; a state's, its compared region only."""
    with np.load(path) as z:
        if "__scenario__" not in z.files:
            raise ParityError(f"{path}: not a scenario file (no __scenario__ entry); re-run the export")
        meta = json.loads(str(z["__scenario__"]))
        functions = {k: FunctionSpec.from_json(f) for k, f in meta["functions"].items()}
        shapes = {t.name: t.shape for f in functions.values() for t in f.states}
        calls, refs, state = [], [], {}
        for i, c in enumerate(meta["calls"]):
            inputs = {t.name: z[f"call{i}/input/{t.name}"] for t in functions[c["function"]].inputs}
            prefix = f"call{i}/eager/"
            ref = {k[len(prefix):]: z[k] for k in z.files if k.startswith(prefix)}
            for name, (axis, n) in c["state_valid"].items():
                values = z[f"call{i}/{_ROWS}{name}/values"]
                if name not in state:
                    state[name] = np.zeros(shapes[name], values.dtype)
                index = [slice(None)] * values.ndim
                index[axis] = z[f"call{i}/{_ROWS}{name}/index"]
                state[name][tuple(index)] = values
                ref[_STATE + name] = np.take(state[name], np.arange(n), axis=axis)
            refs.append(ref)
            calls.append(Call(c["function"], inputs, {k: tuple(v) for k, v in c["valid"].items()},
                              {k: tuple(v) for k, v in c["state_valid"].items()}))
    return Scenario(meta["name"], functions, tuple(calls)), refs


def load_traced(path: Path) -> list[dict[str, np.ndarray]]:
    """Per call, the traced module's outputs a stateless export kept (`save_scenario`'s `traced`)."""
    with np.load(path) as z:
        n = len(json.loads(str(z["__scenario__"]))["calls"])
        return [{k[len(f"call{i}/traced/"):]: z[k] for k in z.files if k.startswith(f"call{i}/traced/")}
                for i in range(n)]


# ------------------------------------------------------------------------------ package side
def _score_call(scenario: Scenario, i: int, outputs: Mapping[str, np.ndarray], states: Mapping[str, np.ndarray] | None,
                reference: Mapping[str, np.ndarray], gate: Gate, gate_states: bool) -> dict:
    c = scenario.calls[i]
    fn = scenario.functions[c.function]
    missing = [t.name for t in fn.outputs if t.name not in reference]
    if missing:
        raise ParityError(f"scenario {scenario.name}: call {i} reference lacks outputs {missing}")
    scored = _score(fn, outputs, reference, dict(c.valid), gate)
    scored_states = {}
    if states is not None:
        for name, region in c.state_valid.items():
            key = _STATE + name
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
                 keep_outputs: Sequence[str] = ()) -> dict:
    """Play every call on one runner's program, the state carried, and score each."""
    state = program.new_state(scenario.calls[0].function) if scenario.states else None
    calls, seconds, kept = [], 0.0, {name: [] for name in keep_outputs}
    for i, c in enumerate(scenario.calls):
        t0 = time.perf_counter()
        outputs = program.run(c.function, c.inputs, state)
        seconds += time.perf_counter() - t0
        states = program.read_states(state) if state is not None else None
        calls.append(_score_call(scenario, i, outputs, states, reference[i], gate, gate_states))
        for name in keep_outputs:
            if name in outputs:  # (call, value): functions of a package return different outputs
                kept[name].append((i, np.asarray(outputs[name])))
    worst = [r["min_snr_db"] for r in calls if r["min_snr_db"] is not None]
    out = {"calls": calls, "min_snr_db": min(worst) if worst else None,
           "passed": all(r["passed"] for r in calls),
           "meets_target": all(r["meets_target"] for r in calls), "seconds": round(seconds, 4)}
    if keep_outputs:
        out["_outputs"] = kept  # not JSON: the caller scores and drops it
    return out


def _macos_version() -> tuple[int, ...] | None:
    if sys.platform != "darwin":
        return None
    import platform

    return tuple(int(x) for x in platform.mac_ver()[0].split(".")[:2] if x.isdigit()) or None


def run_scenario(package: Path, scenario: Scenario, reference: Sequence[Mapping[str, np.ndarray]], gate: Gate,
                 gate_states: bool = True, compute_units: str = "CPU_AND_GPU", keep_outputs: Sequence[str] = ()) -> dict:
    """Play the scenario on the package with one state carried through all calls; score each call.

    Executors (:mod:`anetts.runtime.runners`): the MIL reference executor everywhere; Core ML on
    macOS (states need macOS 15). `gate_states`: the states' valid regions count towards the gate,
    not only the outputs. `keep_outputs`: per backend, every call's value of these outputs under
    `_outputs` (e.g. logits, for top-1 agreement).
    """
    from anetts.runtime.errors import ArtifactError
    from anetts.runtime.runners import PackageRef, load_program

    if len(reference) != len(scenario.calls):
        raise ParityError(f"scenario {scenario.name}: {len(reference)} references for {len(scenario.calls)} calls")
    first = scenario.calls[0].function
    used = dict.fromkeys(c.function for c in scenario.calls)  # the package may have functions the calls skip
    ref = PackageRef(label=f"{Path(package).name} (scenario {scenario.name})", path=Path(package),
                     functions=tuple(scenario.functions[n] for n in used), function=first, compute_units=compute_units)

    def play(executor: str) -> dict:
        try:
            program = load_program(executor, ref)
        except ArtifactError as e:
            raise ParityError(f"{package}: {e}") from e
        return _run_backend(scenario, reference, gate, gate_states, program, keep_outputs)

    has_states = bool(scenario.states)
    backends = {"mil": play("mil")}
    macos = _macos_version()
    if macos is not None and (macos >= (15, 0) or not has_states):  # Core ML states need macOS 15
        backends["coreml"] = {**play("coreml"), "compute_units": compute_units}
    elif macos is not None:
        backends["coreml"] = {"skipped": f"Core ML states need macOS 15 (this is {'.'.join(map(str, macos))})"}
    else:
        backends["coreml"] = {"skipped": f"CoreML predict needs macOS (this is {sys.platform})"}
    gated = [b for b in backends.values() if "passed" in b]
    return {"scenario": scenario.name, "package": str(package), "gate": asdict(gate), "gate_states": gate_states,
            "calls": [{"function": c.function, "valid": {k: list(v) for k, v in c.valid.items() if v is not None},
                       "state_valid": {k: list(v) for k, v in c.state_valid.items()}} for c in scenario.calls],
            "backends": backends, "passed": all(b["passed"] for b in gated), "provenance": provenance()}


def per_call_db(report: dict, backend: str = "mil") -> list[float | None]:
    """The worst gated SNR (dB) of each call, in call order."""
    return [r["min_snr_db"] for r in report["backends"][backend]["calls"]]


def check_scenario(report: dict, out_json: Path) -> dict:
    """Write the report if every call of every backend passed; else write `.failed.json` and raise."""
    def why(r: dict) -> str:
        bad = {name: [(c["call"], c["function"], c["min_snr_db"]) for c in b["calls"] if not c["passed"]]
               for name, b in r["backends"].items() if "passed" in b and not b["passed"]}
        return f"scenario {r['scenario']} failed its parity gate (min {r['gate']['min_snr_db']} dB) at (call, function, dB) {bad}"

    return write_verdict(report, out_json, why)


__all__ = ["Call", "Scenario", "check_scenario", "load_scenario", "load_traced", "per_call_db", "record_eager",
           "run_scenario", "save_scenario"]
