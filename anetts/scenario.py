"""A scenario: the calls a package's parity plays, in order, with its state carried from call to
call, and the file that stores them with their expected outputs (`<bucket>.scenario.npz`).

A one-call stage (a Kokoro bucket, the Fish codec) has a scenario of one call of `main` on its example
inputs; a stage with states (a chunk of transformer layers with `prefill` and `decode` and a KV cache)
has upstream's teacher-forced calls, because a single call cannot show a cache written at the wrong
position. numpy only: the export writes these files, parity and `anetts bench` read them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from anetts.artifacts import atomic_outputs
from anetts.tensors import FunctionSpec

STATE = "state/"  # a reference's key for a state, before its name
_ROWS = "eager_rows/state/"  # in the file: per call and state, the rows it changed (`save_scenario`)


class ScenarioError(ValueError):
    pass


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


def save_scenario(path: Path, scenario: Scenario, reference: Sequence[Mapping[str, np.ndarray]]) -> None:
    """Inputs, regions and expected outputs (and states) per call in one .npz (atomic), for `load_scenario`.

    A state is kept only where a call compares it (`state_valid`), and as what the call changed:
    along the region's axis, the rows that differ from the state after the previous call (zeros
    before the first, as Core ML allocates states), with their indices. Each call writes a few
    rows, so a 4-layer S2 Pro chunk's 146 calls keep megabytes instead of 4.9 GB of whole caches;
    `load_scenario` rebuilds every call's state exactly."""
    if len(reference) != len(scenario.calls):
        raise ValueError(f"scenario {scenario.name}: references for {len(reference)} calls, "
                         f"but {len(scenario.calls)} calls")
    arrays = {"__scenario__": np.array(json.dumps(scenario.to_json()))}
    before: dict[str, np.ndarray] = {}
    for i, (c, ref) in enumerate(zip(scenario.calls, reference)):
        arrays.update({f"call{i}/input/{k}": np.asarray(v) for k, v in c.inputs.items()})
        arrays.update({f"call{i}/eager/{k}": np.asarray(v) for k, v in ref.items() if not k.startswith(STATE)})
        for name, (axis, _) in c.state_valid.items():
            now = np.asarray(ref[STATE + name])
            prev = _rows_like(before.get(name), now, axis)
            others = tuple(a for a in range(now.ndim) if a != axis)
            rows = np.flatnonzero(np.any(now != prev, axis=others)).astype(np.int32)
            arrays[f"call{i}/{_ROWS}{name}/index"] = rows
            arrays[f"call{i}/{_ROWS}{name}/values"] = np.take(now, rows, axis=axis)
            before[name] = now
    with atomic_outputs(Path(path)) as (tmp,):
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)


def load_scenario(path: Path) -> tuple[Scenario, list[dict[str, np.ndarray]]]:
    """The scenario and, per call, its eager references; a state's, its compared region only."""
    with np.load(path) as z:
        if "__scenario__" not in z.files:
            raise ScenarioError(f"{path}: not a scenario file (no __scenario__ entry); re-run the export")
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
                ref[STATE + name] = np.take(state[name], np.arange(n), axis=axis)
            refs.append(ref)
            calls.append(Call(c["function"], inputs, {k: tuple(v) for k, v in c["valid"].items()},
                              {k: tuple(v) for k, v in c["state_valid"].items()}))
    return Scenario(meta["name"], functions, tuple(calls)), refs


def positions(scenario: Scenario) -> list[int]:
    """Each call's position in the sequence: its `pos` input where it has one, else its index."""
    return [int(c.inputs["pos"][0]) if "pos" in c.inputs else i for i, c in enumerate(scenario.calls)]
