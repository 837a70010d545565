"""The contract between a model family and the build machinery.

A family (Kokoro, Fish) declares stages; a stage declares, per bucket, its package's functions
(typed inputs, outputs and fp16 states), how to load the part of the upstream model it needs, how to
build a traceable module from it, and the scenario its package is checked on: the calls, in order,
and what each must give. Export, convert, parity and compress know nothing else about it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from anetts.scenario import Call, Scenario
from anetts.tensors import FunctionSpec

if TYPE_CHECKING:  # only for annotations: the runtime reads TensorSpecs without importing torch
    import torch


class Stage(ABC):
    """A traceable piece of a model, compiled to one package per bucket.

    Its package has `functions` (the first its default), all built from one module (`build`) over
    what `load` returns, and is checked on `scenario`: calls played in order with the state
    carried, each scored against the outputs it expects."""

    name: str
    description: str = ""

    @abstractmethod
    def functions(self, size: int) -> list[FunctionSpec]:
        """The package's entry points at bucket `size`; the first is the package's default."""

    def geometry(self, size: int) -> dict[str, int]:
        return {}

    @abstractmethod
    def load(self, weights_dir: Path, size: int) -> Any:
        """Only the part of the upstream model this stage needs (a chunk of a 4.5 B model must not
        load the rest)."""

    @abstractmethod
    def build(self, model: Any) -> torch.nn.Module:
        """One module for every function: forward takes a function's inputs in spec order and
        returns its outputs in spec order; states are buffers named like them, updated in place."""

    @abstractmethod
    def scenario(self, model: Any, weights_dir: Path, size: int, reference: dict[str, np.ndarray] | None
                 ) -> tuple[Scenario, list[dict[str, np.ndarray]] | None]:
        """(the calls, per call the outputs expected: upstream's tensors at the stage's boundary from
        the shared reference run). None for the expected outputs: the eager wrapper is the reference
        (one call per function, no states), recorded while the export traces it."""

    def logits_outputs(self) -> tuple[str, ...]:
        """Outputs that are logits: their top-1 agreement is gated (Gate.min_top1) wherever declared."""
        return ()

    def configure(self, params: dict) -> "Stage":
        """This stage as its config block's build keys shape it (Kokoro's generator `layout`)."""
        return self

    def uncompressed_weights(self) -> tuple[str, ...]:
        """Weights (the module's parameter names, which the package's consts keep) that no compressed
        variant may compress: they stay at the stage's precision (`anetts.compile.compress`)."""
        return ()


class OneCallStage(Stage):
    """A stage of one stateless function, `main`, checked by one call on example inputs (a Kokoro
    bucket, the Fish codec): its scenario is that call, its valid regions the inputs' masks."""

    @abstractmethod
    def function(self, size: int) -> FunctionSpec:
        """The package's one function at bucket `size` (named `MAIN_FUNCTION`, as Core ML names it)."""

    @abstractmethod
    def bucket_name(self, size: int) -> str: ...

    @abstractmethod
    def example_inputs(self, model: Any, weights_dir: Path, size: int,
                       reference: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Deterministic, realistic inputs filling a realistic part of the bucket (from the family's
        shared reference run when the declaration says `uses_reference`)."""

    @abstractmethod
    def valid_regions(self, inputs: dict[str, np.ndarray]) -> dict[str, tuple[int, int] | None]:
        """Per output: (axis, valid length) implied by the inputs' masks, or None if all valid."""

    def functions(self, size: int) -> list[FunctionSpec]:
        return [self.function(size)]

    def scenario(self, model, weights_dir, size, reference=None):
        fn = self.function(size)
        inputs = self.example_inputs(model, Path(weights_dir), size, reference)
        regions = self.valid_regions(inputs)
        call = Call(fn.name, {t.name: inputs[t.name] for t in fn.inputs},
                    {t.name: (tuple(regions[t.name]) if regions.get(t.name) is not None else None) for t in fn.outputs})
        return Scenario(f"{self.name}/{self.bucket_name(size)}", {fn.name: fn}, (call,)), None


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
    # weights dir → the upstream model of the shared reference run (`make_reference`); a stage loads
    # only what it needs itself (`Stage.load`)
    load_reference_model: Callable[[Path], Any]
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
            return self.stages[name].configure(params or {})
        if self.make_stage is None or params is None:
            raise KeyError(f"family {self.name!r} has no stage {name!r}; stages: {sorted(self.stages)}")
        return self.make_stage(name, dict(params), Path(weights_dir))
