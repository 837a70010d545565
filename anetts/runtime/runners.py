"""One runner per executor: load a package's functions into a :class:`Program`, make fresh states,
run ``function(inputs, state)``.

The executors (:data:`EXECUTORS`, the one list the CLI, bench and the runtimes use):

- ``torch``: the TorchScript exports the packages were converted from (fp32, any OS): a folder of
  ``<function>.pt`` per package (a one-call stage: ``main.pt``), whose state buffers (named as
  the functions' :class:`~anetts.tensors.StateSpec`) are shared by binding one state to every
  function's module.
- ``mil``: the MIL reference executor (:mod:`anetts.mil`) on the .mlpackage (any OS, slow).
- ``coreml``: Core ML through coremltools (macOS only; checked before anything is imported), one
  ``MLModel`` per function, one state from ``make_state()`` passed to every function.
- ``coreai``: Apple's Core AI runtime on a ``.aimodel`` (its Linux CPU runtime here, the OS runtime
  on macOS), where a model has them (the ``aimodel`` rule builds them; manifests list none yet).

A program is loaded from anything with the attributes of :class:`PackageRef` (``label``, ``path``,
``functions``, ``function``, ``torchscript``, ``aimodel``, ``compute_units``): a manifest's
:class:`~anetts.runtime.manifest.PackageEntry`, or a ``PackageRef`` a build step makes from its files
before any manifest exists (parity). :class:`Runner` is the per-model cache the runtimes call: it
verifies a package's sha256 before its first load.

Nothing here imports torch or a build module at import time: the runtime's Core ML path stays
torch-free (coremltools itself imports torch when it is installed).
"""
from __future__ import annotations

import logging
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from anetts.runtime.errors import ArtifactError, BackendUnavailable, InputError
from anetts.tensors import FunctionSpec

if TYPE_CHECKING:
    from anetts.runtime.manifest import ModelArtifacts

log = logging.getLogger(__name__)

EXECUTORS = ("torch", "mil", "coreml", "coreai")
COMPUTE_UNITS = ("ALL", "CPU_ONLY", "CPU_AND_GPU", "CPU_AND_NE")


def default_executor(has_torchscript: bool = True) -> str:
    """The one default for every family: Core ML on macOS; elsewhere the fp32 TorchScript exports
    (fast on a CPU), or the MIL executor where a model has no faithful TorchScript (a compressed
    variant: its exports would be the uncompressed model)."""
    if sys.platform == "darwin":
        return "coreml"
    return "torch" if has_torchscript else "mil"


def check_executor(name: str) -> str:
    if name not in EXECUTORS:
        raise InputError(f"unknown backend {name!r}; choose one of {list(EXECUTORS)}")
    return name


@dataclass(frozen=True)
class PackageRef:
    """What a runner loads, made from build files (a manifest's PackageEntry has the same fields)."""

    label: str  # "<stage>/<bucket>", for messages
    path: Path | None  # the .mlpackage (mil, coreml)
    functions: tuple[FunctionSpec, ...]
    function: str  # the function a call without a name runs
    torchscript: Path | None = None  # the export's folder of <function>.pt (torch)
    aimodel: Path | None = None  # the .aimodel (coreai)
    compute_units: str | None = None  # coreml


def _functions(entry) -> dict[str, FunctionSpec]:
    fns = {f.name: f for f in entry.functions}
    if not fns:
        raise ArtifactError(f"{entry.label}: no typed functions (the manifest predates version 3; rebuild)")
    return fns


def set_torch_threads(threads: int | None) -> None:
    """torch's intra-op threads (the torch and MIL executors run on torch)."""
    if threads is None:
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InputError(f"threads must be >= 1, got {threads!r}")
    import torch

    torch.set_num_threads(threads)


class Program:
    """One loaded package: its typed functions, fresh states, checked calls."""

    executor = "base"

    def __init__(self, label: str, functions: Mapping[str, FunctionSpec], default: str):
        self.label, self.functions, self.default_function = label, dict(functions), default

    def function(self, name: str | None) -> FunctionSpec:
        name = self.default_function if name is None else name
        spec = self.functions.get(name)
        if spec is None:
            raise ArtifactError(f"{self.label}: no function {name!r}; functions: {sorted(self.functions)}")
        return spec

    def new_state(self, function: str | None = None):
        """Fresh zeroed states of `function` (default: the package's default function), shared by every
        function declaring the same states; None when it is stateless."""
        spec = self.function(function)
        return self._new_state(spec) if spec.states else None

    def check_inputs(self, spec: FunctionSpec, inputs: Mapping[str, np.ndarray]) -> None:
        where = f"{self.label} function {spec.name}"
        for t in spec.inputs:
            if t.name not in inputs:
                raise InputError(f"{where}: missing input {t.name!r}")
            a = inputs[t.name]
            if not isinstance(a, np.ndarray) or tuple(a.shape) != t.shape or a.dtype != t.np_dtype:
                got = f"{tuple(a.shape)} {a.dtype}" if isinstance(a, np.ndarray) else type(a).__name__
                raise InputError(f"{where}: input {t.name} must be {t.shape} {t.dtype}, got {got}")
        extra = sorted(set(inputs) - {t.name for t in spec.inputs})
        if extra:
            raise InputError(f"{where}: unknown inputs {extra}; it takes {[t.name for t in spec.inputs]}")

    def run(self, function: str | None, inputs: Mapping[str, np.ndarray], state=None) -> dict[str, np.ndarray]:
        """Outputs of one call, named, shaped and typed as the function's spec; `state` (from
        :meth:`new_state`) is read and updated in place by a stateful function."""
        spec = self.function(function)
        self.check_inputs(spec, inputs)
        if spec.states and state is None:
            raise InputError(f"{self.label} function {spec.name} keeps states: pass state=program.new_state()")
        out = self._run(spec, {t.name: inputs[t.name] for t in spec.inputs}, state if spec.states else None)
        missing = [t.name for t in spec.outputs if t.name not in out]
        if missing:
            raise ArtifactError(f"{self.executor} executor: {self.label} function {spec.name} returned no {missing}")
        return {t.name: np.asarray(out[t.name]).reshape(t.shape).astype(t.np_dtype, copy=False) for t in spec.outputs}

    def read_states(self, state) -> dict[str, np.ndarray]:
        """The values of a state made by :meth:`new_state`, as float32 numpy arrays by name."""
        raise NotImplementedError

    def copy_state(self, state):
        """A new state holding the values of `state` (made by :meth:`new_state` of this program), independent
        of it: calls with either leave the other as it was (a snapshot, e.g. of a prefilled KV cache)."""
        return None if state is None else self._copy_state(state)

    def state_bytes(self, state) -> int:
        """Bytes a state of this program holds (default: the declared states, in their declared dtype)."""
        spec = self._stateful()
        return sum(int(np.prod(t.shape)) * np.dtype(t.np_dtype).itemsize for t in spec.states)

    def _stateful(self) -> FunctionSpec:
        """The function whose states a state of this program is (every stateful function shares them)."""
        spec = self.function(None)
        if spec.states:
            return spec
        spec = next((f for f in self.functions.values() if f.states), None)
        if spec is None:
            raise InputError(f"{self.label} keeps no states")
        return spec

    def _new_state(self, spec: FunctionSpec):  # pragma: no cover - per executor
        raise NotImplementedError

    def _copy_state(self, state):  # pragma: no cover - per executor
        raise NotImplementedError

    def _run(self, spec: FunctionSpec, inputs: dict, state) -> dict:  # pragma: no cover - per executor
        raise NotImplementedError


class MilRunner(Program):
    """The .mlpackage's ML Program on the MIL reference executor."""

    executor = "mil"

    def __init__(self, entry, threads: int | None = None):
        super().__init__(entry.label, _functions(entry), entry.function)
        set_torch_threads(threads)
        from anetts.mil import load_program  # part of this package: a broken executor is an error, not "unavailable"

        try:
            self.program = load_program(str(entry.path))
        except Exception as e:  # noqa: BLE001 - surface as an artifact problem naming the package
            raise ArtifactError(f"MIL executor cannot load {entry.label} ({entry.path}): {e}") from e
        missing = sorted(set(self.functions) - set(self.program.function_names))
        if missing:
            raise ArtifactError(f"{entry.label} ({entry.path}) has no functions {missing}; it has {self.program.function_names}")

    def _new_state(self, spec):
        return self.program.make_state(spec.name)

    def _run(self, spec, inputs, state):
        return self.program.run(inputs, function_name=spec.name, state=state)

    def read_states(self, state):
        return {k: np.asarray(v, np.float32) for k, v in state.to_numpy().items()}

    def _copy_state(self, state):
        # the executor never writes into a state's tensor (write_state replaces it: anetts.mil.ops.state,
        # and slice_update clones), so the copy may share them
        return state.copy()


class SharedTensors:
    """One copy of each weight for every torch program of a stage. Each bucket's (and each function's)
    TorchScript holds its own copy of the stage's weights (kokoro-tiny: 1.3 GB for 22 buckets of four
    stages); a tensor equal (name, dtype, shape, values) to one already loaded for the same stage is
    pointed at that one's storage, so memory grows with the stages used, not with the buckets."""

    def __init__(self):
        self._seen: dict[tuple, list] = {}
        self._lock = threading.Lock()

    def adopt(self, stage: str, module, keep: frozenset[str] = frozenset()) -> None:
        """Share ``module``'s parameters and buffers (except the names in ``keep``: state buffers)."""
        import torch

        with self._lock, torch.no_grad():
            for name, t in [*module.named_parameters(), *module.named_buffers()]:
                if name in keep or name.rsplit(".", 1)[-1] in keep or t.numel() == 0:
                    continue
                same = self._seen.setdefault((stage, name, t.dtype, tuple(t.shape)), [])
                for other in same:
                    if other.data_ptr() == t.data_ptr() or torch.equal(other, t):
                        t.set_(other)
                        break
                else:
                    same.append(t)


class TorchRunner(Program):
    """The traced fp32 modules; one state dict of tensors bound to every function's buffers."""

    executor = "torch"

    def __init__(self, entry, threads: int | None = None, shared: SharedTensors | None = None):
        ts = entry.torchscript
        if ts is None or not Path(ts).exists():
            raise ArtifactError(f"torch backend: the TorchScript export of {entry.label} is missing ({ts}); "
                                "rebuild, or use another backend")
        fns = _functions(entry)
        own = {p.stem: p for p in Path(ts).glob("*.pt")} if Path(ts).is_dir() else {}
        if entry.function in own:
            files = {name: own[name] for name in fns if name in own}
        elif len(own) == 1:  # a bundle's bucket: the bundle names its export's one function after the bucket
            files = {entry.function: next(iter(own.values()))}
        else:
            raise ArtifactError(f"torch backend: {ts} holds no TorchScript of {entry.label}'s function "
                                f"{entry.function!r} (a folder of <function>.pt); rebuild, or use another backend")
        super().__init__(entry.label, {name: fns[name] for name in files}, entry.function)
        set_torch_threads(threads)
        import torch

        self.torch = torch
        self.modules = {}
        for name, path in files.items():
            try:
                with warnings.catch_warnings():  # torch >= 2.10 flags jit.load as deprecated; the exports are TorchScript
                    warnings.simplefilter("ignore", DeprecationWarning)
                    self.modules[name] = torch.jit.load(str(path), map_location="cpu").eval()
            except Exception as e:  # noqa: BLE001 - torch raises many types for bad archives
                raise ArtifactError(f"cannot load TorchScript of {entry.label} ({path}): {e}") from e
            if shared is not None:
                shared.adopt(entry.label.split("/", 1)[0], self.modules[name], frozenset(t.name for t in fns[name].states))
        self._bound = None
        self._lock = threading.Lock()

    def _new_state(self, spec):
        module = self.modules[spec.name]
        buffers = dict(module.named_buffers())
        state = {}
        for t in spec.states:
            if t.name not in buffers or tuple(buffers[t.name].shape) != t.shape:
                raise ArtifactError(f"{self.label}: the TorchScript of {spec.name} has no buffer {t.name} {t.shape}")
            state[t.name] = self.torch.zeros_like(buffers[t.name])  # the export's dtype (fp32)
        return state

    def _run(self, spec, inputs, state):
        torch = self.torch
        args = [torch.from_numpy(np.ascontiguousarray(inputs[t.name])) for t in spec.inputs]
        if state is None:  # stateless: calls from several threads run side by side
            with torch.inference_mode():
                out = self.modules[spec.name](*args)
        else:  # the state lives in the modules' buffers: bind it, then call, one caller at a time
            with self._lock, torch.inference_mode():
                if self._bound is not state:
                    for m in self.modules.values():
                        for n, t in state.items():
                            setattr(m, n, t)
                    self._bound = state
                out = self.modules[spec.name](*args)
        out = out if isinstance(out, (tuple, list)) else (out,)
        if len(out) != len(spec.outputs):
            raise ArtifactError(f"torch backend: {self.label} {spec.name} returned {len(out)} outputs, "
                                f"its spec lists {len(spec.outputs)}")
        return {t.name: o.numpy() for t, o in zip(spec.outputs, out)}

    def read_states(self, state):
        return {k: v.float().numpy().copy() for k, v in state.items()}

    def _copy_state(self, state):
        # the exports update their state buffers in place: the copy needs tensors of its own
        with self._lock:  # not while a call writes into `state`
            return {k: v.clone() for k, v in state.items()}

    def state_bytes(self, state) -> int:
        return sum(v.numel() * v.element_size() for v in state.values())  # the export's dtype (fp32)


def _coremltools():
    if sys.platform != "darwin":
        raise BackendUnavailable(
            f"the coreml backend needs macOS (Core ML runs only there); this platform is {sys.platform!r}. "
            "Use --backend torch (backend='torch') or --backend mil instead")
    try:
        import coremltools as ct
    except ImportError as e:
        raise BackendUnavailable(f"the coreml backend needs coremltools: {e}") from e
    return ct


def check_compute_units(cu: str, where: str) -> str:
    if cu not in COMPUTE_UNITS:
        raise InputError(f"unknown compute units {cu!r} for {where}; choose one of {list(COMPUTE_UNITS)}")
    return cu


class CoreMLRunner(Program):
    """Core ML (macOS): one MLModel per function, loaded on first call; states need macOS 15."""

    executor = "coreml"

    def __init__(self, entry, compute_units: str | None = None):
        self._ct = _coremltools()
        super().__init__(entry.label, _functions(entry), entry.function)
        self.path = entry.path
        self.compute_units = check_compute_units(compute_units or entry.compute_units or "ALL", entry.label)
        self._models: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._model(self.default_function)  # a package Core ML cannot compile fails at load, naming it

    def _model(self, name: str):
        m = self._models.get(name)
        if m is None:
            with self._lock:
                m = self._models.get(name)
                if m is None:
                    ct = self._ct
                    # a per-bucket package has only its default `main`; a bundle's functions are named
                    kwargs = {"function_name": name} if name != "main" else {}
                    try:
                        m = self._models[name] = ct.models.MLModel(
                            str(self.path), compute_units=ct.ComputeUnit[self.compute_units], **kwargs)
                    except Exception as e:  # noqa: BLE001 - Core ML reports compile errors as many types
                        raise ArtifactError(f"Core ML cannot load {self.label} ({self.path}) function {name} "
                                            f"with {self.compute_units}: {e}") from e
        return m

    def _new_state(self, spec):
        return self._model(spec.name).make_state()

    def _run(self, spec, inputs, state):
        kw = {"state": state} if state is not None else {}
        return self._model(spec.name).predict(inputs, **kw)

    def read_states(self, state):
        names = {t.name for f in self.functions.values() for t in f.states}
        return {n: np.asarray(state.read_state(n), np.float32) for n in sorted(names)}

    def _copy_state(self, state):
        spec = self._stateful()
        other = self._model(spec.name).make_state()
        for t in spec.states:
            other.write_state(t.name, state.read_state(t.name))
        return other


class CoreAIRunner(Program):
    """Apple's Core AI runtime on a `.aimodel` (an fp16 asset takes and gives fp16: cast at the boundary)."""

    executor = "coreai"

    def __init__(self, entry):
        asset = getattr(entry, "aimodel", None)
        if asset is None:
            raise BackendUnavailable(f"the coreai backend runs .aimodel assets; {entry.label} has none "
                                     "(build them with the `aimodels` target)")
        super().__init__(entry.label, _functions(entry), entry.function)
        self.asset = Path(asset)
        self.io = asset_io(self.asset)
        missing = sorted(set(self.functions) - set(self.io))
        if missing:
            raise ArtifactError(f"{self.asset}: no functions {missing}; functions: {sorted(self.io)}")

    def _new_state(self, spec):
        raise BackendUnavailable(f"the coreai backend does not run stateful functions yet ({self.label} {spec.name})")

    def _copy_state(self, state):
        raise BackendUnavailable(f"the coreai backend does not run stateful functions yet ({self.label})")

    def _run(self, spec, inputs, state):
        return run_asset(self.asset, inputs, spec.name, self.io)


# ------------------------------------------------------------------------------------------------
# Core AI assets (used by the runner above and by the build's converter, anetts.compile.aimodel)
# ------------------------------------------------------------------------------------------------

_CORE_AI_DTYPES = {"Float32": np.float32, "Float16": np.float16, "Int32": np.int32}


class AIModelError(RuntimeError):
    pass


def _asset_class():
    from coreai.authoring import AIModelAsset  # imports no torch (coreai_torch, the converter, does)

    return AIModelAsset


def parse_tensor_type(text: str) -> tuple[np.dtype, tuple[int, ...]]:
    """Core AI's summary spells tensor types as "NDArray (Float32, 1 × 4 × 16)"."""
    import re

    m = re.fullmatch(r"NDArray \((\w+), ([^)]*)\)", text.strip())
    if m is None or m.group(1) not in _CORE_AI_DTYPES:
        raise AIModelError(f"unrecognised Core AI tensor type {text!r}")
    dims = m.group(2).replace("×", "x").split("x")
    return np.dtype(_CORE_AI_DTYPES[m.group(1)]), tuple(int(d) for d in dims if d.strip())


def asset_summary(asset_path: Path):
    summary = _asset_class().load(Path(asset_path)).summary(include_statistics=True)
    if summary is None:
        raise AIModelError(f"{asset_path}: asset has no program")
    return summary


def asset_io(asset_path: Path, summary=None) -> dict[str, dict]:
    """{function: {"inputs": [...], "outputs": [...]}} (name, shape, dtype) of a saved asset."""
    asset_path = Path(asset_path)
    if not asset_path.is_dir():
        raise AIModelError(f"{asset_path}: not a Core AI asset (no such directory)")
    summary = summary if summary is not None else asset_summary(asset_path)

    def describe(pairs):
        out = []
        for name, text in pairs:
            dtype, shape = parse_tensor_type(text)
            out.append({"name": name, "shape": list(shape), "dtype": dtype.name})
        return out

    return {f: {"inputs": describe(summary.function_inputs(f)), "outputs": describe(summary.function_outputs(f))}
            for f in summary.function_names}


def run_asset(asset_path: Path, inputs: Mapping[str, np.ndarray], function: str | None = None,
              io: dict | None = None) -> dict[str, np.ndarray]:
    """Run one function of an asset with Apple's runtime; float outputs come back as float32.

    Inputs are checked by name and shape against the function's signature and cast to its
    declared dtype (fp16 assets take fp16), so a wrong input is an error naming it, never a
    crash inside the runtime."""
    import asyncio

    from coreai.runtime import NDArray

    asset_path = Path(asset_path)
    io = io if io is not None else asset_io(asset_path)
    if function is None:
        if len(io) != 1:
            raise AIModelError(f"{asset_path}: has functions {sorted(io)}; name one")
        function = next(iter(io))
    if function not in io:
        raise AIModelError(f"{asset_path}: no function {function!r}; functions: {sorted(io)}")
    feed = {}
    for t in io[function]["inputs"]:
        if t["name"] not in inputs:
            raise AIModelError(f"{asset_path}: missing input: {t['name']}")
        a = np.asarray(inputs[t["name"]])
        if list(a.shape) != t["shape"]:
            raise AIModelError(f"{asset_path}: expected shape {tuple(t['shape'])}, got {a.shape} for input: {t['name']}")
        want = np.dtype(t["dtype"])
        if a.dtype.kind != want.kind and not (a.dtype.kind in "iu" and want.kind in "iu"):
            raise AIModelError(f"{asset_path}: expected a {want.name} array, got {a.dtype} for input: {t['name']}")
        feed[t["name"]] = NDArray(np.ascontiguousarray(a.astype(want, copy=False)))
    unknown = sorted(set(inputs) - set(feed))
    if unknown:
        raise AIModelError(f"{asset_path}: unknown inputs {unknown}; function {function} takes {sorted(feed)}")
    AIModelAsset = _asset_class()

    async def go():
        async with AIModelAsset.load(asset_path).executable() as model:
            return await model.load_function(function)(feed)

    out = asyncio.run(go())
    return {k: (v.numpy().astype(np.float32) if v.numpy().dtype == np.float16 else v.numpy()) for k, v in out.items()}


# ------------------------------------------------------------------------------------------------
# loading
# ------------------------------------------------------------------------------------------------

def load_program(executor: str, entry, *, threads: int | None = None, compute_units: str | None = None,
                 shared: SharedTensors | None = None) -> Program:
    """`entry` (a PackageEntry or PackageRef) on `executor`; options apply where they mean something
    (threads: torch, mil; compute_units: coreml; shared: torch, the weights of programs loaded before)."""
    check_executor(executor)
    if executor == "torch":
        return TorchRunner(entry, threads=threads, shared=shared)
    if executor == "mil":
        return MilRunner(entry, threads=threads)
    if executor == "coreml":
        return CoreMLRunner(entry, compute_units=compute_units)
    return CoreAIRunner(entry)


class Runner:
    """The programs of one model directory on one executor, each verified (sha256) and loaded on
    first use, then cached: what a family runtime calls."""

    def __init__(self, executor: str | None, artifacts: "ModelArtifacts", *, threads: int | None = None,
                 compute_units: str | Mapping[str, str] | None = None):
        if executor in (None, "auto"):
            executor = default_executor(artifacts.torchscript_faithful)
        self.name = check_executor(executor)
        self.artifacts = artifacts
        self._threads, self._units = threads, compute_units
        if executor == "coreml":
            _coremltools()
            for stage in {s for s, _ in artifacts.packages}:
                self.compute_units(stage)  # fail early on a bad name
        elif executor in ("torch", "mil"):
            set_torch_threads(threads)
        if executor == "torch":
            missing = [e.label for e in artifacts.packages.values() if e.torchscript is None or not e.torchscript.exists()]
            if missing:
                raise ArtifactError(
                    f"torch backend: TorchScript exports missing for {missing} in {artifacts.model_dir} "
                    "(not listed in the manifest, or the file is gone); rebuild, or use another backend")
        if executor == "coreai":
            missing = [e.label for e in artifacts.packages.values() if e.aimodel is None]
            if missing:
                raise BackendUnavailable(f"the coreai backend runs .aimodel assets; the manifest of "
                                         f"{artifacts.model_dir} lists none for {missing}")
        self._programs: dict[Any, Program] = {}
        self._shared = SharedTensors()  # torch: one copy of a stage's weights across its buckets
        self._lock = threading.Lock()

    def compute_units(self, stage: str, entry=None) -> str:
        cu = self._units.get(stage) if isinstance(self._units, Mapping) else self._units
        cu = cu or (entry.compute_units if entry else None) or self.artifacts.stage_compute_units(stage) or "ALL"
        return check_compute_units(cu, f"stage {stage}")

    def _key(self, entry):
        # a bundle's buckets share one package (mil, coreml); torch runs each bucket's own export
        return entry.torchscript if self.name == "torch" else entry.path

    def program(self, stage: str, bucket: str) -> Program:
        entry = self.artifacts.package(stage, bucket)
        key = self._key(entry)
        p = self._programs.get(key)
        if p is None:
            with self._lock:
                p = self._programs.get(key)
                if p is None:
                    self.artifacts.verify(entry, torchscript=self.name == "torch")
                    p = self._programs[key] = load_program(
                        self.name, entry, threads=self._threads, shared=self._shared,
                        compute_units=self.compute_units(stage, entry) if self.name == "coreml" else None)
                    log.debug("%s backend loaded %s", self.name, entry.label)
        return p

    def unload(self, stages) -> None:
        """Drop the loaded programs of these stages (every bucket); a later call loads them again."""
        stages = set(stages)
        with self._lock:
            for (stage, bucket) in self.artifacts.packages:
                if stage in stages:
                    self._programs.pop(self._key(self.artifacts.package(stage, bucket)), None)

    def prepare(self, stage: str, bucket: str) -> None:
        """Verify and load the stage's bucket now; idempotent."""
        self.program(stage, bucket)

    def loaded(self) -> list[tuple[str, str]]:
        """The (stage, bucket)s whose program is loaded now."""
        with self._lock:
            return [sb for sb, entry in self.artifacts.packages.items() if self._key(entry) in self._programs]

    def run(self, stage: str, bucket: str, inputs: Mapping[str, np.ndarray], function: str | None = None,
            state=None) -> dict[str, np.ndarray]:
        """One call of the bucket's function (default: the one the manifest names for the bucket)."""
        entry = self.artifacts.package(stage, bucket)
        return self.program(stage, bucket).run(function or entry.function, inputs, state)

    def new_state(self, stage: str, bucket: str, function: str | None = None):
        entry = self.artifacts.package(stage, bucket)
        return self.program(stage, bucket).new_state(function or entry.function)


__all__ = ["AIModelError", "COMPUTE_UNITS", "EXECUTORS", "PackageRef", "Program", "Runner", "asset_io", "check_executor",
           "default_executor", "load_program", "run_asset"]
