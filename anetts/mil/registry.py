"""Op registry and the load-time view of one op that op builders receive.

Every MIL op type maps to a *builder*: ``builder(node) -> Kernel``.  Builders run once,
at load time.  They read the op's constant parameters (axes, strides, pad_type, ...)
into plain Python values, pre-convert constant tensors (e.g. conv weights to fp32), and
return a :class:`Kernel`: a closure ``fn`` plus the list of arguments it takes at run
time.  The interpreter loop then only looks up vars and calls closures, which keeps the
per-op dispatch cost to a few microseconds.

A builder that meets an attribute value it cannot execute faithfully raises
:class:`Unsupported`; the loader collects those for all ops and reports them together.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from .dtypes import TORCH_DTYPES, to_torch
from .spec import NO_VALUE, Arg, OpIR, ValueType

Builder = Callable[["Node"], "Kernel"]
_BUILDERS: dict[str, Builder] = {}


class Unsupported(Exception):
    """Raised by a builder when an op's attributes are outside what we implement."""


def register(*op_types: str) -> Callable[[Builder], Builder]:
    def deco(fn: Builder) -> Builder:
        for t in op_types:
            if t in _BUILDERS:
                raise RuntimeError(f"op {t!r} registered twice")
            _BUILDERS[t] = fn
        return fn

    return deco


def builder_for(op_type: str) -> Builder | None:
    return _BUILDERS.get(op_type)


def supported_ops() -> list[str]:
    return sorted(_BUILDERS)


class Fixed:
    """A kernel argument whose value is fixed at load time (passed to ``fn`` as-is)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


@dataclass
class Kernel:
    """``fn(*args)`` computes the op; ``args`` names what to pass.

    Each entry of ``args`` is an input parameter name (resolved at run time to the var's
    tensor, to the const's default torch tensor, to a list of those for tuple inputs,
    or to None when the optional input is absent) or a :class:`Fixed` value.
    ``fn`` returns a tensor, or a tuple of tensors for multi-output ops.
    """

    fn: Callable[..., Any]
    args: list[Any]


class Node:
    """Load-time view of one op: its constant parameters and declared output types."""

    def __init__(
        self, op: OpIR, opset_version: int, var_types: dict[str, ValueType], tensor_cache: dict | None = None,
        widen_weights: bool = True,
    ):
        self.op = op
        self._tensor_cache = {} if tensor_cache is None else tensor_cache
        # whether const weights are widened to fp32 at load (see program.WIDEN_AT_LOAD_MAX_BYTES)
        self.widen_weights = widen_weights
        self.type = op.type
        self.name = op.name
        self._opset = opset_version
        # the opset versions at which this op's kernel changes behaviour (`opset_at_least`)
        self.opset_boundaries: set[int] = set()
        self._var_types = var_types

    def opset_at_least(self, version: int) -> bool:
        """Whether the program's opset is `version` (17: iOS17) or later. The one way a builder reads
        the opset: each version asked is recorded, so two programs alike but for their opsets are
        known to run alike unless one of these lies between them (`anetts.mil.compare`)."""
        self.opset_boundaries.add(version)
        return self._opset >= version

    # ----------------------------------------------------------------- inputs
    def has(self, param: str) -> bool:
        return param in self.op.inputs

    def args(self, param: str) -> list[Arg]:
        return self.op.inputs[param]

    def is_const(self, param: str) -> bool:
        args = self.op.inputs.get(param)
        return bool(args) and all(a.is_const for a in args)

    def input_type(self, param: str, index: int = 0) -> ValueType | None:
        args = self.op.inputs.get(param)
        if not args:
            return None
        a = args[index]
        if a.name is not None and a.name in self._var_types:
            return self._var_types[a.name]
        if a.is_const:
            v = np.asarray(a.value)
            from .dtypes import name_of_numpy

            try:
                return ValueType("tensor", name_of_numpy(v.dtype), tuple(v.shape))
            except KeyError:
                return ValueType("tensor", None, tuple(v.shape))
        return None

    def input_rank(self, param: str) -> int | None:
        t = self.input_type(param)
        return None if t is None or t.shape is None else len(t.shape)

    def input_dtype(self, param: str) -> str | None:
        t = self.input_type(param)
        return None if t is None else t.dtype

    def const(self, param: str, default: Any = NO_VALUE) -> Any:
        """The load-time value of a const input (numpy / python), or ``default``."""
        args = self.op.inputs.get(param)
        if not args:
            if default is NO_VALUE:
                raise Unsupported(f"required input {param!r} missing")
            return default
        if len(args) != 1:
            return [a.value for a in args]
        if not args[0].is_const:
            if default is NO_VALUE:
                raise Unsupported(f"input {param!r} must be constant")
            raise Unsupported(f"input {param!r} is not constant (only constant {param!r} supported)")
        return args[0].value

    def int(self, param: str, default: Any = NO_VALUE) -> int:
        v = self.const(param, default)
        return v if v is None else int(np.asarray(v).reshape(()))

    def float(self, param: str, default: Any = NO_VALUE) -> float:
        v = self.const(param, default)
        return v if v is None else float(np.asarray(v).reshape(()))

    def bool(self, param: str, default: Any = NO_VALUE) -> bool:
        v = self.const(param, default)
        return v if v is None else bool(np.asarray(v).reshape(()))

    def str(self, param: str, default: Any = NO_VALUE) -> str:
        v = self.const(param, default)
        if v is None or isinstance(v, str):
            return v
        return str(np.asarray(v).reshape(()).item())

    def ints(self, param: str, default: Any = NO_VALUE) -> list[int] | None:
        v = self.const(param, default)
        if v is None:
            return None
        return [int(x) for x in np.asarray(v).reshape(-1)]

    def bools(self, param: str, default: Any = NO_VALUE) -> list[bool] | None:
        v = self.const(param, default)
        if v is None:
            return None
        return [bool(x) for x in np.asarray(v).reshape(-1)]

    def tensor(self, param: str, dtype: torch.dtype | None = None, default: Any = NO_VALUE):
        """A const input as a torch tensor, optionally converted to ``dtype``."""
        v = self.const(param, default)
        if v is None:
            return None
        t = to_torch(v)
        if dtype is not None and t.dtype != dtype:
            t = t.to(dtype)
        return t

    def weight(self, param: str):
        """A weight-like input as a kernel argument: absent, ``Fixed(None)``; dynamic, its name; a const,
        a ``Fixed`` tensor. A float const is widened to fp32 here, once per value for the whole program
        (the functions of a multifunction package and the unrolled passes of one function share their
        weights), unless the program keeps its weights in the dtype stored (``widen_weights`` False);
        kernels widen whatever reaches them in fp16."""
        if not self.has(param):
            return Fixed(None)
        if not self.is_const(param):
            return param
        v = self.const(param)
        t = self.tensor(param)
        if not self.widen_weights or not t.is_floating_point() or t.dtype == torch.float32:
            return Fixed(t)
        key = ("fp32", id(v))
        hit = self._tensor_cache.get(key)
        if hit is None or hit[0] is not v:
            hit = (v, t.float())
            self._tensor_cache[key] = hit
        return Fixed(hit[1])

    def tensor_of(self, arg: Arg):
        """Default run-time form of a const binding: a torch tensor (strings stay str).

        Converted once per const value (the cache is shared by the whole program)."""
        v = arg.value
        if v is None or isinstance(v, str):
            return v
        hit = self._tensor_cache.get(id(v))
        if hit is not None and hit[0] is v:
            return hit[1]
        t = to_torch(v)
        self._tensor_cache[id(v)] = (v, t)
        return t

    # ---------------------------------------------------------------- outputs
    @property
    def out_types(self) -> list[ValueType]:
        return [t for _, t in self.op.outputs]

    @property
    def out_type(self) -> ValueType:
        return self.op.outputs[0][1]

    @property
    def out_dtype(self) -> torch.dtype:
        """torch dtype of the first output (what the result must be rounded to)."""
        return self.torch_dtype(self.out_type.dtype)

    @property
    def out_shape(self) -> tuple[int | None, ...] | None:
        return self.out_type.shape

    @staticmethod
    def torch_dtype(name: str | None) -> torch.dtype:
        if name not in TORCH_DTYPES:
            raise Unsupported(f"dtype {name!r} not supported at run time")
        return TORCH_DTYPES[name]
