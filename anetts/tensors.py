"""Typed tensors of a package's functions: what a stage declares, the runtime loads and a scenario
plays. numpy only (the runtime reads these without torch)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

DTYPES = {"float32": np.float32, "int32": np.int32}
# Core ML keeps model state (ct.StateType, macOS15 / iOS18) in fp16 only
STATE_DTYPES = {"float16": np.float16}
# the name Core ML gives the one function of a single-function package
MAIN_FUNCTION = "main"
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def function_name(bucket: str) -> str:
    """A MIL-safe function name for a bucket (its function in a bundle, or a Core AI asset):
    ``t32`` stays, ``3s`` becomes ``b3s``.

    Compiled models carry the program as MIL text, whose names are identifiers (coremltools
    sanitizes var/op names the same way: ``mil_backend::sanitize_name_strings``), so function
    names must match ``[A-Za-z_][A-Za-z0-9_]*``."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", str(bucket))
    return name if IDENTIFIER.match(name) else f"b{name}"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32" | "int32": CoreML I/O stays fp32/int32 even when compute is fp16
    description: str
    allowed_dtypes: ClassVar[dict] = DTYPES

    def __post_init__(self):
        if self.dtype not in self.allowed_dtypes:
            raise ValueError(f"tensor {self.name}: unsupported dtype {self.dtype!r}; "
                             f"choose one of {sorted(self.allowed_dtypes)}")

    @property
    def np_dtype(self):
        return self.allowed_dtypes[self.dtype]

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "description": self.description}

    @classmethod
    def from_json(cls, d: dict) -> "TensorSpec":
        return cls(str(d["name"]), tuple(int(x) for x in d["shape"]), str(d["dtype"]), d.get("description", ""))

    def check(self, array: np.ndarray, where: str) -> None:
        """Raise naming this input when `array` does not match the spec."""
        if tuple(array.shape) != self.shape:
            raise ValueError(f"{where}: expected shape {self.shape}, got {tuple(array.shape)} for input: {self.name}")
        if array.dtype != self.np_dtype:
            raise ValueError(f"{where}: expected dtype {self.dtype}, got {array.dtype} for input: {self.name}")


@dataclass(frozen=True)
class StateSpec(TensorSpec):
    """A state buffer of a function (e.g. a KV cache): persists between calls, fp16 only."""

    allowed_dtypes: ClassVar[dict] = STATE_DTYPES


@dataclass(frozen=True)
class FunctionSpec:
    """One entry point of a package (`prefill`, `decode`, or a bucket): its I/O and its states.

    Functions of one package that declare the same states share them: a state made for one
    (Core ML's `makeState()`, `MilProgram.make_state`) is passed to the calls of the others."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    states: tuple[StateSpec, ...] = ()

    def __post_init__(self):
        for t in (*self.inputs, *self.outputs):
            if t.dtype not in DTYPES:  # a StateSpec passed as I/O
                raise ValueError(f"function {self.name}: input/output {t.name} must be one of {sorted(DTYPES)}")
        for t in self.states:
            if not isinstance(t, StateSpec):
                raise ValueError(f"function {self.name}: state {t.name} must be a StateSpec (fp16)")
        names = [t.name for t in (*self.inputs, *self.outputs, *self.states)]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"function {self.name}: names used twice among inputs, outputs and states: {dup}")

    def to_json(self) -> dict:
        return {"name": self.name, "inputs": [t.to_json() for t in self.inputs],
                "outputs": [t.to_json() for t in self.outputs], "states": [t.to_json() for t in self.states]}

    @classmethod
    def from_json(cls, d: dict) -> "FunctionSpec":
        return cls(str(d["name"]), tuple(TensorSpec.from_json(t) for t in d["inputs"]),
                   tuple(TensorSpec.from_json(t) for t in d["outputs"]),
                   tuple(StateSpec.from_json(t) for t in d.get("states", ())))
