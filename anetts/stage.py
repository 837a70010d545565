"""The contract between a model family and the build machinery.

A family (Kokoro, Fish) declares stages; a stage declares, per bucket, its package's functions
(typed inputs, outputs and fp16 states), how to build a traceable module from the upstream model,
and how to check it: realistic example inputs (one call) or a teacher-forced scenario of calls.
Trace, convert, execute and compare know nothing else about it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import numpy as np

if TYPE_CHECKING:  # only for annotations: the runtime reads TensorSpecs without importing torch
    import torch

DTYPES = {"float32": np.float32, "int32": np.int32}
# Core ML keeps model state (ct.StateType, macOS15 / iOS18) in fp16 only
STATE_DTYPES = {"float16": np.float16}
# the name Core ML gives the one function of a single-function package
MAIN_FUNCTION = "main"


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
class BucketSpec:
    """One stage at one static shape."""

    stage: str
    bucket: str
    size: int  # the config value the bucket was made from (tokens or seconds)
    geometry: dict[str, int]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def to_json(self) -> dict:
        return {
            "stage": self.stage,
            "bucket": self.bucket,
            "size": self.size,
            "geometry": dict(self.geometry),
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
        }

    @classmethod
    def from_json(cls, d: dict) -> "BucketSpec":
        return cls(
            d["stage"], d["bucket"], d["size"], dict(d["geometry"]),
            tuple(TensorSpec.from_json(t) for t in d["inputs"]),
            tuple(TensorSpec.from_json(t) for t in d["outputs"]),
        )

    def function(self) -> "FunctionSpec":
        """The bucket as its package's one function (stateless, named as Core ML names it)."""
        return FunctionSpec(MAIN_FUNCTION, self.inputs, self.outputs)


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


class Stage(ABC):
    """A traceable piece of a model, compiled to one package per bucket.

    Every stage is a function stage: its package has functions (`functions`: typed inputs,
    outputs and fp16 states), all built from one module (`build`). A stateless stage (a Kokoro
    bucket, the Fish codec) has one function, `main`, and is verified by one call on example
    inputs: it implements `bucket_name`, `spec`, `example_inputs` and `valid_regions`. A stage of
    several functions sharing weights and states (a chunk of transformer layers with `prefill` and
    `decode` and a KV cache) is verified by a teacher-forced scenario, the calls of an upstream run
    in order with the state carried: it implements `load` and `scenario`. Which of the two a stage
    is, the family's declaration says (`anetts.family.StageDecl.kind`)."""

    name: str
    description: str = ""

    def functions(self, size: int) -> list[FunctionSpec]:
        """The package's entry points at bucket `size`; the first is the package's default."""
        return [self.spec(size).function()]

    def geometry(self, size: int) -> dict[str, int]:
        return {}

    @abstractmethod
    def build(self, model: Any) -> torch.nn.Module:
        """One module for every function: forward takes a function's inputs in spec order and
        returns its outputs in spec order; states are buffers named like them, updated in place."""

    def logits_outputs(self) -> tuple[str, ...]:
        """Outputs that are logits: their top-1 agreement with upstream is gated (Gate.min_top1)."""
        return ()

    def uncompressed_weights(self) -> tuple[str, ...]:
        """Weights (the module's parameter names, which the package's consts keep) that no compressed
        variant may compress: they stay at the stage's precision (`anetts.compile.compress`)."""
        return ()

    # -- a stateless stage: one function at one bucket, one call on example inputs (from the
    # family's shared reference run when its declaration says `uses_reference`)
    def bucket_name(self, size: int) -> str:
        raise self._not_a("stateless", "bucket_name")

    def spec(self, size: int) -> BucketSpec:
        raise self._not_a("stateless", "spec")

    def example_inputs(self, model: Any, weights_dir: Path, size: int,
                       reference: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Deterministic, realistic inputs filling a realistic part of the bucket."""
        raise self._not_a("stateless", "example_inputs")

    def valid_regions(self, inputs: dict[str, np.ndarray]) -> dict[str, tuple[int, int] | None]:
        """Per output: (axis, valid length) implied by the inputs' masks, or None if all valid."""
        raise self._not_a("stateless", "valid_regions")

    # -- a stage verified by a scenario of calls
    def load(self, weights_dir: Path, size: int) -> Any:
        """Only the tensors this stage needs (a chunk of a 4.5 B model must not load the rest)."""
        raise self._not_a("scenario", "load")

    def scenario(self, model: Any, size: int, reference: dict[str, np.ndarray]):
        """(Scenario, upstream outputs per call: {output name: array}) from the shared reference run."""
        raise self._not_a("scenario", "scenario")

    def _not_a(self, kind: str, method: str) -> NotImplementedError:
        return NotImplementedError(f"stage {self.name}: `{method}` belongs to {kind} stages; this stage does not "
                                   f"implement it (see anetts.stage.Stage)")


@dataclass(frozen=True)
class VoicePacks:
    """A family whose weights carry voice packs (Kokoro): where they live and which to fetch."""

    file: Callable[[str], str]  # voice name → relative path in a weights dir
    defaults: tuple[str, ...]  # voices fetched from a real source when config names none
    synthetic: tuple[str, ...]  # the voices synthetic weights make


@dataclass(frozen=True)
class Family:
    """A model family: its stages and how to get from weights on disk to the upstream model."""

    name: str
    stages: dict[str, Stage]
    # (weights dir, stage name or None for the shared reference run) → the upstream model (or just
    # the part of it that stage needs), ready to trace: a chunk of layers must not need the whole model
    load_model: Callable[[Path, str | None], Any]
    weights_files: tuple[str, ...]  # files every weights dir holds, besides voices
    synthesize: Callable[[Path, str, int, Path], dict]  # (out_dir, preset, seed, scratch) → report
    validate_weights: Callable[[Path, list, Path], dict]  # (dir, voices, scratch) → model config
    voices: VoicePacks | None = None  # None: the family has no voice packs (Fish)
    # (model, weights dir, size) → named arrays: upstream's stage-boundary tensors for one example
    make_reference: Callable[[Any, Path, int], dict] | None = None
    # weights dir → JSON-able parameters the runtime's host DSP needs (not part of any package)
    host_params: Callable[[Path], dict] | None = None
    # (weights dir, out dir) → relative paths of the files the runtime reads besides packages
    write_runtime_assets: Callable[[Path, Path], list] | None = None
    # (source block, staging dir, voices, scratch) → report: an ONNX export in the upstream layout
    convert_onnx: Callable[[dict, Path, list, Path], dict] | None = None
    # (fetch(names), staging dir): the files of a real (hf/local) source when `weights_files` cannot
    # list them up front (an index naming its shards); fetch copies names into staging
    gather_weights: Callable[[Callable[[list], None], Path], None] | None = None
    # (stage name, its stage params from config, weights dir) → the Stage it is, for stages made
    # from their config parameters (Fish's chunks of layers); `stages` holds the others
    make_stage: Callable[[str, dict, Path], Stage] | None = None
    # (packages {stage: path}, weights dir, reference npz, gate, params, settings) → report: the
    # compiled packages composed as the runtime composes them, against upstream (rule chain_parity;
    # settings: the model's `chain` block)
    check_chain: Callable[..., dict] | None = None
    # (runtime over the compiled packages, weights dir, params, gate) → report with "passed" and
    # "checks": the runtime end to end against upstream on fixed texts (rule end_to_end)
    check_end_to_end: Callable[..., dict] | None = None

    def stage(self, name: str, params: dict | None = None, weights_dir: Path | None = None) -> Stage:
        """Stage `name`: a declared one, or one `make_stage` builds from its config `params`."""
        if name in self.stages:
            return self.stages[name]
        if self.make_stage is None or params is None:
            raise KeyError(f"family {self.name!r} has no stage {name!r}; stages: {sorted(self.stages)}")
        return self.make_stage(name, dict(params), Path(weights_dir))
