"""Stage runners: one small interface, three ways to execute a built stage.

``run(stage, bucket, inputs) -> outputs`` with numpy arrays named as in the manifest. Models are
loaded lazily on first use (after the package's sha256 is checked) and cached.

- ``torch``: the traced TorchScript exports (any OS; default off macOS).
- ``coreml``: the .mlpackages through coremltools (macOS only), compute units per stage.
- ``mil``: the MIL reference executor ``anetts.mil`` on the .mlpackages (any OS, slow).
"""
from __future__ import annotations

import logging
import sys
import threading
import warnings
from typing import Mapping, Protocol, runtime_checkable

import numpy as np

from anetts.runtime.errors import ArtifactError, BackendUnavailable, InputError
from anetts.runtime.manifest import ModelArtifacts, PackageEntry

log = logging.getLogger(__name__)

BACKENDS = ("torch", "coreml", "mil")
COMPUTE_UNITS = ("ALL", "CPU_ONLY", "CPU_AND_GPU", "CPU_AND_NE")


def default_backend() -> str:
    return "coreml" if sys.platform == "darwin" else "torch"


@runtime_checkable
class StageRunner(Protocol):
    name: str

    def prepare(self, stage: str, bucket: str) -> None:
        """Load (and verify) the stage's bucket now; idempotent."""

    def run(self, stage: str, bucket: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Execute one stage bucket; inputs/outputs named and shaped as the manifest says."""


class _CachingRunner:
    """Shared part: lazy, verified, cached loading and input checking."""

    name = "base"
    uses_torchscript = False

    def __init__(self, artifacts: ModelArtifacts):
        self.artifacts = artifacts
        self._models: dict[tuple[str, str], object] = {}
        self._lock = threading.Lock()

    def _load(self, entry: PackageEntry):  # pragma: no cover - abstract
        raise NotImplementedError

    def _cache_key(self, entry: PackageEntry):
        return entry.key

    def _model(self, entry: PackageEntry):
        key = self._cache_key(entry)
        m = self._models.get(key)
        if m is None:
            with self._lock:
                m = self._models.get(key)
                if m is None:
                    self.artifacts.verify(entry, torchscript=self.uses_torchscript)
                    m = self._models[key] = self._load(entry)
                    log.debug("%s backend loaded %s", self.name, entry.label)
        return m

    def prepare(self, stage: str, bucket: str) -> None:
        self._model(self.artifacts.package(stage, bucket))

    def run(self, stage: str, bucket: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        entry = self.artifacts.package(stage, bucket)
        entry.check_inputs(inputs)
        outputs = self._execute(entry, self._model(entry), inputs)
        missing = [t.name for t in entry.outputs if t.name not in outputs]
        if missing:
            raise ArtifactError(f"{self.name} backend: {entry.label} did not return outputs {missing}")
        return {t.name: np.asarray(outputs[t.name]).reshape(t.shape).astype(t.np_dtype, copy=False) for t in entry.outputs}

    def _execute(self, entry, model, inputs) -> dict[str, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError


class TorchBackend(_CachingRunner):
    """Runs ``export/<stage>/<bucket>.pt`` (TorchScript of the stage wrapper) on the CPU."""

    name = "torch"
    uses_torchscript = True

    def __init__(self, artifacts: ModelArtifacts, threads: int | None = None):
        super().__init__(artifacts)
        import torch

        self._torch = torch
        if threads is not None:
            if threads < 1:
                raise InputError(f"threads must be >= 1, got {threads}")
            torch.set_num_threads(int(threads))
        missing = [e.label for e in artifacts.packages.values() if e.torchscript is None or not e.torchscript.is_file()]
        if missing:
            raise ArtifactError(
                f"torch backend: TorchScript exports missing for {missing} in {artifacts.model_dir} "
                "(not listed in the manifest, or the file is gone); rebuild, or use another backend"
            )

    def _load(self, entry: PackageEntry):
        torch = self._torch
        try:
            with warnings.catch_warnings():  # torch >= 2.10 flags jit.load as deprecated; the exports are TorchScript
                warnings.simplefilter("ignore", DeprecationWarning)
                module = torch.jit.load(str(entry.torchscript), map_location="cpu")
        except Exception as e:  # noqa: BLE001 - torch raises many types for bad archives
            raise ArtifactError(f"cannot load TorchScript of {entry.label} ({entry.torchscript}): {e}") from e
        return module.eval()

    def _execute(self, entry, model, inputs):
        torch = self._torch
        args = [torch.from_numpy(np.ascontiguousarray(inputs[t.name])) for t in entry.inputs]
        with torch.inference_mode():
            out = model(*args)
        out = out if isinstance(out, (tuple, list)) else (out,)
        if len(out) != len(entry.outputs):
            raise ArtifactError(f"torch backend: {entry.label} returned {len(out)} outputs, manifest lists {len(entry.outputs)}")
        return {t.name: o.numpy() for t, o in zip(entry.outputs, out)}


class CoreMLBackend(_CachingRunner):
    """Runs the .mlpackages with Core ML (macOS only)."""

    name = "coreml"

    def __init__(self, artifacts: ModelArtifacts, compute_units: str | Mapping[str, str] | None = None):
        if sys.platform != "darwin":
            raise BackendUnavailable(
                f"the coreml backend needs macOS (Core ML runs only there); this platform is {sys.platform!r}. "
                "Use --backend torch (backend='torch') or --backend mil instead"
            )
        super().__init__(artifacts)
        try:
            import coremltools as ct
        except ImportError as e:
            raise BackendUnavailable(f"the coreml backend needs coremltools: {e}") from e
        self._ct = ct
        self._units = compute_units
        for stage in {s for s, _ in artifacts.packages}:
            self.compute_units(stage)  # fail early on a bad name

    def compute_units(self, stage: str, entry: PackageEntry | None = None) -> str:
        cu = self._units.get(stage) if isinstance(self._units, Mapping) else self._units
        cu = cu or (entry.compute_units if entry else None) or self.artifacts.stage_compute_units(stage) or "ALL"
        if cu not in COMPUTE_UNITS:
            raise InputError(f"unknown compute units {cu!r} for stage {stage}; choose one of {list(COMPUTE_UNITS)}")
        return cu

    def _cache_key(self, entry: PackageEntry):
        return (entry.path, entry.function)  # one MLModel per function of a bundle

    def _load(self, entry: PackageEntry):
        ct = self._ct
        cu = self.compute_units(entry.stage, entry)
        # a bundle's functions are named; a per-bucket package has only its default `main`
        kwargs = {"function_name": entry.function} if entry.function != "main" else {}
        try:
            return ct.models.MLModel(str(entry.path), compute_units=ct.ComputeUnit[cu], **kwargs)
        except Exception as e:  # noqa: BLE001 - Core ML reports compile errors as many types
            raise ArtifactError(f"Core ML cannot load {entry.label} ({entry.path}) with {cu}: {e}") from e

    def _execute(self, entry, model, inputs):
        return model.predict({t.name: inputs[t.name] for t in entry.inputs})


class MilBackend(_CachingRunner):
    """Runs the .mlpackages' ML Programs with the MIL reference executor (``anetts.mil``)."""

    name = "mil"

    def __init__(self, artifacts: ModelArtifacts):
        super().__init__(artifacts)
        from anetts.mil import load_program  # part of this package: a broken executor is an error, not "unavailable"

        self._load_program = load_program

    def _cache_key(self, entry: PackageEntry):
        return entry.path  # a loaded program runs any of its functions (a bundle: every bucket)

    def _load(self, entry: PackageEntry):
        try:
            return self._load_program(str(entry.path))
        except Exception as e:  # noqa: BLE001 - surface as an artifact problem naming the package
            raise ArtifactError(f"MIL executor cannot load {entry.label} ({entry.path}): {e}") from e

    def _execute(self, entry, model, inputs):
        return model.run({t.name: inputs[t.name] for t in entry.inputs}, function_name=entry.function)


def make_backend(name: str | None, artifacts: ModelArtifacts, *, threads: int | None = None,
                 compute_units: str | Mapping[str, str] | None = None) -> StageRunner:
    name = default_backend() if name in (None, "auto") else name
    if name == "torch":
        return TorchBackend(artifacts, threads=threads)
    if name == "coreml":
        return CoreMLBackend(artifacts, compute_units=compute_units)
    if name == "mil":
        return MilBackend(artifacts)
    raise InputError(f"unknown backend {name!r}; choose one of {list(BACKENDS)}")
