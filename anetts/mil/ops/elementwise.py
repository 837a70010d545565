"""Elementwise unary / binary / logical ops, select, clip, cast (MIL iOS15..18).

Semantics follow coremltools' op definitions (``mil/ops/defs/iOS15/elementwise_*.py``
and the iOS17 overrides): broadcasting is numpy-style; ``floor_div`` rounds toward
-inf; ``mod`` has the sign of the divisor (python ``%``); ``real_div`` on int32
truncates toward zero (what the mlprogram backend produces); ``round`` rounds half to
even ("0.5 is rounded to 0"); ``inverse``/``log``/``rsqrt`` add their ``epsilon``
before the operation; ``cast`` truncates floats toward zero when casting to ints.
"""
from __future__ import annotations

import torch

from ..registry import Kernel, Node, Unsupported, register
from ._util import fp16_aware, in_fp32, widen

# --------------------------------------------------------------------------- unary
_UNARY = {
    "acos": torch.acos,
    "asin": torch.asin,
    "atan": torch.atan,
    "atanh": torch.atanh,
    "cos": torch.cos,
    "cosh": torch.cosh,
    "erf": torch.erf,
    "exp": torch.exp,
    "sin": torch.sin,
    "sinh": torch.sinh,
    "sqrt": torch.sqrt,
    "tan": torch.tan,
    "tanh": torch.tanh,
    "ceil": torch.ceil,
    "floor": torch.floor,
    "round": torch.round,  # half to even, as MIL specifies
}
# ops that also accept int32 input (abs, sign, square, exp2)
_UNARY_INT = {
    "abs": torch.abs,
    "sign": torch.sign,
    "square": torch.square,
}


def _build_unary(node: Node) -> Kernel:
    fn = _UNARY.get(node.type) or _UNARY_INT[node.type]
    return Kernel(fp16_aware(fn, node.out_dtype, node.type), ["x"])


register(*_UNARY, *_UNARY_INT)(_build_unary)


@register("exp2")
def _exp2(node: Node) -> Kernel:
    od = node.out_dtype

    def run(x):
        if not x.is_floating_point():  # int32 in, int32 out (value_inference: np.exp2 + cast)
            return torch.exp2(x.double()).to(od)
        return torch.exp2(widen(x)).to(od)

    return Kernel(run, ["x"])


def _eps_op(fn, default_eps):
    def build(node: Node) -> Kernel:
        eps = node.float("epsilon", default_eps) if node.has("epsilon") else default_eps
        return Kernel(in_fp32(lambda x: fn(x, eps), node.out_dtype), ["x"])

    return build


register("inverse")(_eps_op(lambda x, e: torch.reciprocal(x + e), 1e-4))
register("log")(_eps_op(lambda x, e: torch.log(x + e), 1e-45))
register("rsqrt")(_eps_op(lambda x, e: torch.rsqrt(x + e), 1e-12))


@register("logical_not")
def _logical_not(node: Node) -> Kernel:
    return Kernel(torch.logical_not, ["x"])


@register("threshold")
def _threshold(node: Node) -> Kernel:
    alpha = node.float("alpha")
    return Kernel(lambda x: torch.clamp_min(x, alpha), ["x"])


@register("clip")
def _clip(node: Node) -> Kernel:
    alpha, beta = node.float("alpha"), node.float("beta")
    # min(max(x, alpha), beta), exactly like value_inference (also when alpha > beta)
    return Kernel(lambda x: torch.clamp_max(torch.clamp_min(x, alpha), beta), ["x"])


@register("cast")
def _cast(node: Node) -> Kernel:
    target = Node.torch_dtype(node.str("dtype"))
    if target == torch.bool:
        return Kernel(lambda x: x != 0, ["x"])
    return Kernel(lambda x: x.to(target), ["x"])


# -------------------------------------------------------------------------- binary
def _binary_kernel(node: Node, native, widened=None) -> Kernel:
    """``native`` runs on the declared dtype (exact for fp16, see _util); ``widened``
    (default: ``native``) runs on fp32 copies of fp16 inputs, rounded back after."""
    od = node.out_dtype
    in_dt = node.input_dtype("x")
    if widened is not None and in_dt == "fp16":

        def run_w(x, y):
            return widened(x.float(), y.float()).to(od)

        return Kernel(run_w, ["x", "y"])

    def run(x, y):
        r = native(x, y)
        return r if r.dtype == od else r.to(od)

    return Kernel(run, ["x", "y"])


def _int_div(x, y):
    if x.is_floating_point():
        return torch.div(x, y)
    return torch.div(x, y, rounding_mode="trunc")


def _floor_div(x, y):
    if x.is_floating_point():
        return torch.floor(torch.div(x, y))
    return torch.div(x, y, rounding_mode="floor")


_BINARY = {
    "add": (torch.add, None),
    "sub": (torch.sub, None),
    "mul": (torch.mul, None),
    "real_div": (_int_div, None),
    "maximum": (torch.maximum, None),
    "minimum": (torch.minimum, None),
    "floor_div": (_floor_div, _floor_div),
    "mod": (torch.remainder, torch.remainder),
    "pow": (torch.pow, torch.pow),
    "equal": (torch.eq, None),
    "not_equal": (torch.ne, None),
    "greater": (torch.gt, None),
    "greater_equal": (torch.ge, None),
    "less": (torch.lt, None),
    "less_equal": (torch.le, None),
    "logical_and": (torch.logical_and, None),
    "logical_or": (torch.logical_or, None),
    "logical_xor": (torch.logical_xor, None),
}


def _pow_const(node: Node):
    """pow with a constant scalar exponent, as a unary function of x (square for 2)."""
    if node.type != "pow" or not node.is_const("y") or node.input_dtype("x") != "fp16":
        return None
    import numpy as np

    y = np.asarray(node.const("y"))
    if y.size != 1 or node.out_shape != node.input_type("x").shape:
        return None
    e = float(y.reshape(()))
    fn = torch.square if e == 2.0 else (lambda x: torch.pow(x, e))
    return Kernel(fp16_aware(fn, node.out_dtype, ("pow", e)), ["x"])


def _build_binary(node: Node) -> Kernel:
    k = _pow_const(node)
    if k is not None:
        return k
    native, widened = _BINARY[node.type]
    if node.input_dtype("x") != node.input_dtype("y") and None not in (node.input_dtype("x"), node.input_dtype("y")):
        raise Unsupported(f"mixed input dtypes {node.input_dtype('x')} / {node.input_dtype('y')}")
    return _binary_kernel(node, native, widened)


register(*_BINARY)(_build_binary)


@register("select")
def _select(node: Node) -> Kernel:
    od = node.out_dtype

    def run(cond, a, b):
        if cond.dtype != torch.bool:
            cond = cond != 0
        r = torch.where(cond, a, b)
        return r if r.dtype == od else r.to(od)

    return Kernel(run, ["cond", "a", "b"])


@register("identity")
def _identity(node: Node) -> Kernel:
    return Kernel(lambda x: x, ["x"])

