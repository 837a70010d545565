"""Load an .mlpackage's ML Program and interpret it op by op with torch on CPU.

Loading does all the work that does not depend on inputs: parse the protobuf, decode
weights, fold ``constexpr_*`` ops, resolve each op's handler and constant parameters
into a closure (see :mod:`anetts.mil.registry`), and compute when every intermediate
value dies so it can be freed during the run.  Running is then a flat loop over
closures.

Precision: values are held in the dtype the program declares for them (fp16 stays
torch.float16, fp32 stays torch.float32, ...).  After every op the result's dtype and
(known) shape are checked against the op's declared output type, so a handler that
got MIL semantics wrong fails loudly instead of silently drifting.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from anetts.artifacts import tree_bytes

from . import ops as _ops  # noqa: F401  (registers all op builders)
from .dtypes import FLOAT_NAMES, NUMPY_DTYPES, TORCH_DTYPES, to_numpy
from .errors import MilError, MilInputError, MilLoadError, MilRuntimeError, UnsupportedOpError
from .registry import Fixed, Kernel, Node, Unsupported, builder_for
from .spec import BlockIR, FunctionIR, ValueType, load_spec, package_paths, parse_program
from .state import MilState, MilStateSpec

_ENV, _VAL, _LIST = 0, 1, 2

# A program whose weight files hold up to this many bytes has its float weights widened to fp32
# once, at load (the fastest way to run them); a larger one keeps them as stored (fp16: a third of
# the memory, as the widened copy comes on top of the decoded one). The Fish S2 Pro chain's 11
# packages hold 9 GB of fp16 weights, which widened would add 18 GB to.
WIDEN_AT_LOAD_MAX_BYTES = 512 * 2**20


@dataclass(frozen=True)
class InputSpec:
    """A function input: name, numpy dtype, and shape (None for a flexible dimension)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...] | None
    mil_dtype: str
    enumerated_shapes: tuple[tuple[int, ...], ...] | None = None
    shape_range: tuple[tuple[int, int], ...] | None = None  # (lower, upper); upper -1 = unbounded


class _Step:
    __slots__ = ("fn", "argspec", "outs", "checks", "free", "op_type", "op_name", "opset_boundaries")

    def __init__(self, fn, argspec, outs, checks, op_type, op_name, opset_boundaries=frozenset()):
        self.fn = fn
        self.argspec = argspec
        self.outs = outs
        self.checks = checks
        self.free: tuple[str, ...] = ()
        self.op_type = op_type
        self.op_name = op_name
        self.opset_boundaries = opset_boundaries  # Node.opset_at_least's versions


class _Function:
    def __init__(self, ir: FunctionIR, steps: list[_Step], inputs: list[InputSpec],
                 states: list[MilStateSpec] | None = None):
        self.ir = ir
        self.steps = steps
        self.inputs = inputs
        self.states = states or []
        self.output_names = list(ir.block.outputs)
        self.output_types = [ir.var_types.get(n) for n in self.output_names]


def _check_for(vt: ValueType | None):
    """(torch dtype, shape pattern) the runtime checks an op output against, or None."""
    if vt is None or vt.kind != "tensor" or vt.dtype not in TORCH_DTYPES:
        return None
    return (TORCH_DTYPES[vt.dtype], vt.shape)


class MilProgram:
    """An ML Program ready to run.  Create with :func:`load_program`."""

    def __init__(self, package: str, functions: dict[str, _Function], default_function: str):
        self.package = package
        self._functions = functions
        self.default_function = default_function

    # ------------------------------------------------------------------ info
    @property
    def function_names(self) -> list[str]:
        return list(self._functions)

    def _fn(self, function_name: str | None) -> _Function:
        name = self.default_function if function_name is None else function_name
        if name not in self._functions:
            raise MilInputError(
                f"{self.package}: no function {name!r}; functions: {', '.join(self._functions)}"
            )
        return self._functions[name]

    def input_specs(self, function_name: str | None = None) -> list[InputSpec]:
        return list(self._fn(function_name).inputs)

    def output_names(self, function_name: str | None = None) -> list[str]:
        return list(self._fn(function_name).output_names)

    def state_specs(self, function_name: str | None = None) -> list[MilStateSpec]:
        """The function's state inputs (empty for a stateless function)."""
        return list(self._fn(function_name).states)

    def make_state(self, function_name: str | None = None) -> MilState:
        """Zero-filled states for the function, as Core ML's ``makeState()`` allocates them.

        Pass it to :meth:`run` as ``state=``; every call updates it in place.  Functions of one
        package that declare the same states (``prefill`` / ``decode``) accept the same state."""
        f = self._fn(function_name)
        if not f.states:
            raise MilInputError(f"{self.package} [{f.ir.name}]: the function has no states")
        return MilState(f.states)

    def output_dtypes(self, function_name: str | None = None) -> dict[str, np.dtype]:
        f = self._fn(function_name)
        return {
            n: NUMPY_DTYPES.get(t.dtype) if t is not None else None
            for n, t in zip(f.output_names, f.output_types)
        }

    def op_types(self, function_name: str | None = None) -> dict[str, int]:
        """How many ops of each type the function runs (consts/constexprs excluded)."""
        counts: dict[str, int] = {}
        for s in self._fn(function_name).steps:
            counts[s.op_type] = counts.get(s.op_type, 0) + 1
        return dict(sorted(counts.items()))

    # ------------------------------------------------------------------- run
    def run(
        self, inputs: Mapping[str, np.ndarray], function_name: str | None = None, state: MilState | None = None
    ) -> dict[str, np.ndarray]:
        """Run a function; returns its outputs as numpy arrays in their declared dtypes.

        A stateful function needs ``state`` (:meth:`make_state`): the call reads and updates
        it, and leaves it unchanged when it fails."""
        f = self._fn(function_name)
        env = self._bind_inputs(f, inputs)
        with torch.inference_mode():
            env = self._execute_stateful(f, env, state)
            return {
                n: to_numpy(env[n], t.dtype if t is not None else None)
                for n, t in zip(f.output_names, f.output_types)
            }

    def _bind_inputs(self, f: _Function, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        expected = {s.name: s for s in f.inputs}
        missing = [n for n in expected if n not in inputs]
        unknown = [n for n in inputs if n not in expected]
        if missing or unknown:
            parts = []
            if missing:
                parts.append(f"missing input(s) {', '.join(map(repr, missing))}")
            if unknown:
                parts.append(f"unexpected input(s) {', '.join(map(repr, unknown))}")
            raise MilInputError(
                f"{self.package} [{f.ir.name}]: {'; '.join(parts)}; expected inputs: "
                + ", ".join(f"{s.name} {s.mil_dtype}{list(s.shape) if s.shape is not None else '[?]'}" for s in f.inputs)
            )
        env = {}
        for s in f.inputs:
            env[s.name] = _convert_input(s, inputs[s.name], self.package)
        return env

    def _execute_stateful(self, f: _Function, env: dict[str, Any], state: MilState | None) -> dict[str, Any]:
        where = f"{self.package} [{f.ir.name}]"
        if not f.states:
            if state is not None and state.names:
                raise MilInputError(f"{where}: the function has no states, but a state was passed")
            return self._execute(f, env)
        if state is None:
            raise MilInputError(
                f"{where}: the function has states {', '.join(s.name for s in f.states)}; "
                "pass state=program.make_state()"
            )
        if not isinstance(state, MilState):
            raise MilInputError(f"{where}: state must be a MilState (program.make_state()), got {type(state).__name__}")
        cells = state.cells_for(f.states, where)
        env.update(cells)
        env = self._execute(f, env)
        state.commit(cells)  # only after every op succeeded
        return env

    def _execute(self, f: _Function, env: dict[str, Any]) -> dict[str, Any]:
        for step in f.steps:
            args = [
                env[x] if k == 0 else (x if k == 1 else [env[n] if kk == 0 else n for kk, n in x])
                for k, x in step.argspec
            ]
            try:
                out = step.fn(*args)
            except (MilRuntimeError, MilInputError) as exc:
                raise type(exc)(f"{self.package}: {step.op_type} op {step.op_name!r}: {exc}") from exc
            except MilError:
                raise
            except Exception as exc:
                raise MilRuntimeError(
                    f"{self.package}: {step.op_type} op {step.op_name!r} failed: {type(exc).__name__}: {exc}"
                ) from exc
            outs = step.outs
            if len(outs) == 1:
                env[outs[0]] = out
                chk = step.checks[0]
                if chk is not None:
                    _check(step, outs[0], out, chk, self.package)
            else:
                if not isinstance(out, (tuple, list)) or len(out) != len(outs):
                    raise MilRuntimeError(f"{step.op_type} op {step.op_name!r}: expected {len(outs)} outputs")
                for name, val, chk in zip(outs, out, step.checks):
                    env[name] = val
                    if chk is not None:
                        _check(step, name, val, chk, self.package)
            for n in step.free:
                del env[n]
        return env


def _check(step: _Step, name: str, val, chk, package: str) -> None:
    dtype, shape = chk
    if not isinstance(val, torch.Tensor):
        raise MilRuntimeError(f"{package}: {step.op_type} op {step.op_name!r}: output {name!r} is not a tensor")
    if val.dtype != dtype:
        raise MilRuntimeError(
            f"{package}: {step.op_type} op {step.op_name!r}: output {name!r} has dtype {val.dtype}, "
            f"program declares {dtype} (executor bug)"
        )
    if shape is not None:
        got = val.shape
        if len(got) != len(shape) or any(e is not None and e != g for e, g in zip(shape, got)):
            raise MilRuntimeError(
                f"{package}: {step.op_type} op {step.op_name!r}: output {name!r} has shape {tuple(got)}, "
                f"program declares {tuple('?' if d is None else d for d in shape)}"
            )


def _convert_input(spec: InputSpec, value: Any, package: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        arr = value.detach().cpu()
        kind = "f" if arr.is_floating_point() else ("b" if arr.dtype == torch.bool else "i")
        shape = tuple(arr.shape)
    else:
        arr = np.asarray(value)
        kind = {"f": "f", "i": "i", "u": "i", "b": "b"}.get(arr.dtype.kind, arr.dtype.kind)
        shape = arr.shape
    want = spec.mil_dtype
    want_kind = "f" if want in FLOAT_NAMES else ("b" if want == "bool" else "i")
    if kind != want_kind:
        raise MilInputError(
            f"{package}: input {spec.name!r} must be {want} (got {getattr(arr, 'dtype', type(value))})"
        )
    if spec.shape is not None:
        if len(shape) != len(spec.shape) or any(e is not None and e != g for e, g in zip(spec.shape, shape)):
            raise MilInputError(
                f"{package}: input {spec.name!r} must have shape "
                f"{tuple('?' if d is None else d for d in spec.shape)}, got {tuple(shape)}"
            )
    if spec.enumerated_shapes and tuple(shape) not in spec.enumerated_shapes:
        raise MilInputError(
            f"{package}: input {spec.name!r} shape {tuple(shape)} is not one of the enumerated shapes "
            f"{list(spec.enumerated_shapes)}"
        )
    if spec.shape_range:
        for dim, (lo, hi) in zip(shape, spec.shape_range):
            if dim < lo or (hi >= 0 and dim > hi):
                raise MilInputError(
                    f"{package}: input {spec.name!r} shape {tuple(shape)} outside the allowed range {spec.shape_range}"
                )
    if want_kind == "i" and kind == "i":
        a = arr.numpy() if isinstance(arr, torch.Tensor) else arr
        info = np.iinfo(NUMPY_DTYPES[want])
        if a.size and (a.min() < info.min or a.max() > info.max):
            raise MilInputError(f"{package}: input {spec.name!r} has values outside the {want} range")
    tdtype = TORCH_DTYPES[want]
    if isinstance(arr, torch.Tensor):
        return arr.to(tdtype).contiguous()
    t = torch.from_numpy(np.ascontiguousarray(arr.astype(NUMPY_DTYPES[want], copy=False)))
    return t if t.dtype == tdtype else t.to(tdtype)


# ---------------------------------------------------------------------- loading
def load_program(package_path: str | os.PathLike) -> MilProgram:
    """Load an .mlpackage (or a single-file .mlmodel without weights) for execution.

    Raises :class:`UnsupportedOpError` naming every op type the executor cannot run
    (scanning all functions first), or :class:`MilLoadError` for unreadable packages.
    """
    pkg, spec_file, weights_dir = package_paths(package_path)
    spec = load_spec(spec_file)
    weight_bytes = tree_bytes(weights_dir) if weights_dir else 0
    return program_from_spec(spec, str(weights_dir) if weights_dir else None, package=str(pkg),
                             widen_weights=weight_bytes <= WIDEN_AT_LOAD_MAX_BYTES)


def program_from_spec(spec, weights_dir: str | None = None, package: str = "<spec>",
                      widen_weights: bool = True) -> MilProgram:
    """Build a :class:`MilProgram` from an in-memory ``Model_pb2.Model`` spec (``widen_weights``:
    see :data:`WIDEN_AT_LOAD_MAX_BYTES`)."""
    problems: dict[str, list[str]] = {}
    functions_ir = parse_program(spec, weights_dir, package, problems)
    compiled: dict[str, _Function] = {}
    tensor_cache: dict = {}
    for fname, fir in functions_ir.items():
        steps = _compile_block(fir, fir.block, problems, tensor_cache, widen_weights)
        compiled[fname] = _Function(fir, steps, _input_specs(spec, fir), _state_specs(fir))
    if problems:
        raise UnsupportedOpError(package, problems)
    for fname, f in compiled.items():
        _plan_frees(f)
    default = spec.description.defaultFunctionName or ("main" if "main" in compiled else next(iter(compiled)))
    if default not in compiled:
        raise MilLoadError(f"{package}: default function {default!r} not in program")
    return MilProgram(package, compiled, default)


def _compile_block(
    fir: FunctionIR, block: BlockIR, problems: dict[str, list[str]], tensor_cache: dict, widen_weights: bool
) -> list[_Step]:
    steps = []
    for op in block.ops:
        build = builder_for(op.type)
        if build is None or op.blocks:
            problems.setdefault(op.type, []).append(op.name)
            continue
        node = Node(op, fir.opset_version, fir.var_types, tensor_cache, widen_weights)
        try:
            kernel = build(node)
        except Unsupported as exc:
            problems.setdefault(f"{op.type}: {exc}", []).append(op.name)
            continue
        steps.append(_make_step(op, node, kernel))
    return steps


def _make_step(op, node: Node, kernel: Kernel) -> _Step:
    argspec = []
    for a in kernel.args:
        if isinstance(a, Fixed):
            argspec.append((_VAL, a.value))
            continue
        many = a.startswith("*")
        pname = a[1:] if many else a
        bindings = op.inputs.get(pname)
        if not bindings:
            argspec.append((_VAL, [] if many else None))
            continue
        resolved = []
        for b in bindings:
            if b.is_const:
                resolved.append((_VAL, node.tensor_of(b)))
            else:
                resolved.append((_ENV, b.name))
        if many:
            argspec.append((_LIST, tuple(resolved)))
        else:
            if len(resolved) != 1:
                raise Unsupported(f"input {pname!r} has {len(resolved)} bindings")
            argspec.append(resolved[0])
    outs = tuple(n for n, _ in op.outputs)
    checks = tuple(_check_for(t) for _, t in op.outputs)
    return _Step(kernel.fn, tuple(argspec), outs, checks, op.type, op.name, frozenset(node.opset_boundaries))


def _plan_frees(f: _Function) -> None:
    """Attach to each step the vars whose last use it is, so runs free them early."""
    keep = set(f.output_names)
    last: dict[str, int] = {}
    for i, s in enumerate(f.steps):
        for k, x in s.argspec:
            if k == _ENV:
                last[x] = i
            elif k == _LIST:
                for kk, n in x:
                    if kk == _ENV:
                        last[n] = i
        for n in s.outs:  # unused outputs die right away
            last.setdefault(n, i)
    per_step: dict[int, list[str]] = {}
    for n, i in last.items():
        if n not in keep:
            per_step.setdefault(i, []).append(n)
    for i, s in enumerate(f.steps):
        s.free = tuple(per_step.get(i, ()))


def _input_specs(spec, fir: FunctionIR) -> list[InputSpec]:
    desc_inputs = {}
    desc = spec.description
    feats = desc.input
    if len(desc.functions):
        for fd in desc.functions:
            if fd.name == fir.name:
                feats = fd.input
    for fdesc in feats:
        desc_inputs[fdesc.name] = fdesc
    out = []
    for name, vt in fir.inputs:
        if vt.kind == "state":  # see _state_specs
            continue
        if vt.kind != "tensor":
            raise MilLoadError(f"function {fir.name!r} input {name!r}: {vt.kind} inputs are not supported")
        enumerated = shape_range = None
        fd = desc_inputs.get(name)
        if fd is not None and fd.type.WhichOneof("Type") == "multiArrayType":
            ma = fd.type.multiArrayType
            if ma.WhichOneof("ShapeFlexibility") == "enumeratedShapes":
                enumerated = tuple(tuple(int(d) for d in s.shape) for s in ma.enumeratedShapes.shapes)
            elif ma.WhichOneof("ShapeFlexibility") == "shapeRange":
                shape_range = tuple((int(r.lowerBound), int(r.upperBound)) for r in ma.shapeRange.sizeRanges)
        if vt.dtype not in NUMPY_DTYPES:
            raise MilLoadError(f"function {fir.name!r} input {name!r}: dtype {vt.dtype} not supported")
        out.append(InputSpec(name, NUMPY_DTYPES[vt.dtype], vt.shape, vt.dtype, enumerated, shape_range))
    return out


def _state_specs(fir: FunctionIR) -> list[MilStateSpec]:
    out = []
    for name, vt in fir.inputs:
        if vt.kind != "state":
            continue
        if not vt.is_static:
            raise MilLoadError(f"function {fir.name!r} state {name!r}: flexible state shapes are not supported")
        if vt.dtype not in NUMPY_DTYPES:
            raise MilLoadError(f"function {fir.name!r} state {name!r}: dtype {vt.dtype} not supported")
        out.append(MilStateSpec(name, tuple(int(d) for d in vt.shape), vt.dtype))
    return out


__all__ = ["InputSpec", "MilProgram", "load_program", "program_from_spec"]
