"""Multiply-accumulates per op of a saved ML Program, from the shapes its types declare.

Only ops that multiply learned or data tensors together count (a MAC is one multiply and one add):

| op | MACs |
|---|---|
| conv | output elements x (input channels / groups) x kernel size |
| conv_transpose | input elements x (output channels / groups) x kernel size |
| linear, matmul | output elements x the contracted length |
| einsum | product of every index's extent, for two operands |
| lstm | steps x batch x directions x 4 x hidden x (input + hidden) |

Elementwise, normalization and reduction ops do a few operations per element and are left out: at
Kokoro's sizes they are a small share of the work, and a MAC count that only says "matmuls and
convolutions" is what placement is about. The counts are static: a bucket's shapes are fixed.
"""
from __future__ import annotations

import math

from anetts.compile.spec_walk import function_ops, immediate_ints, tensor_dims

COUNTED = ("conv", "conv_transpose", "linear", "matmul", "einsum", "lstm")


def _types(fn, ops) -> dict[str, list[int | None]]:
    """Name -> dims of every tensor a function's ops and inputs declare."""
    out = {}
    for inp in fn.inputs:
        if inp.type.WhichOneof("type") == "tensorType":
            out[inp.name] = tensor_dims(inp.type.tensorType)
    for op in ops:
        for o in op.outputs:
            if o.type.WhichOneof("type") == "tensorType":
                out[o.name] = tensor_dims(o.type.tensorType)
    return out


def _arg(op, key: str, types: dict) -> list[int | None] | None:
    if key not in op.inputs:
        return None
    for b in op.inputs[key].arguments:
        if b.WhichOneof("binding") == "name":
            return types.get(b.name)
        if b.WhichOneof("binding") == "value" and b.value.type.WhichOneof("type") == "tensorType":
            return tensor_dims(b.value.type.tensorType)
    return None


def _known(*dims_lists) -> bool:
    return all(d is not None and None not in d for d in dims_lists)


def _scalar(op, key: str, consts: dict, default: int) -> int:
    if key in op.attributes:
        vals = immediate_ints(op.attributes[key])
        return vals[0] if vals else default
    if key in op.inputs:
        for b in op.inputs[key].arguments:
            kind = b.WhichOneof("binding")
            if kind == "value":
                vals = immediate_ints(b.value)
                return vals[0] if vals else default
            if kind == "name" and b.name in consts:
                vals = immediate_ints(consts[b.name])
                return vals[0] if vals else default
    return default


def _string(op, key: str, consts: dict) -> str:
    """A string parameter: an attribute, an inline input value, or (as coremltools saves einsum's
    equation) an input bound to a const op."""
    val = op.attributes.get(key) if key in op.attributes else None
    if val is None and key in op.inputs:
        for b in op.inputs[key].arguments:
            kind = b.WhichOneof("binding")
            val = b.value if kind == "value" else consts.get(b.name) if kind == "name" else None
            break
    if val is None or val.WhichOneof("value") != "immediateValue":
        return ""
    strings = val.immediateValue.tensor.strings.values
    return strings[0] if strings else ""


def op_macs(op, types: dict, consts: dict) -> int:
    """MACs of one op (0 for ops not in COUNTED or with unknown shapes)."""
    out = [types.get(o.name) for o in op.outputs]
    t = op.type
    if t == "conv":
        w, y = _arg(op, "weight", types), out[0]
        if not _known(w, y):
            return 0
        return math.prod(y) * math.prod(w[1:])  # weight (C_out, C_in/groups, *kernel)
    if t == "conv_transpose":
        x, w = _arg(op, "x", types), _arg(op, "weight", types)
        if not _known(x, w):
            return 0
        # weight (C_in, C_out/groups, *kernel): every input element meets C_out/groups x kernel weights
        return math.prod(x) * math.prod(w[1:])
    if t == "linear":
        w, y = _arg(op, "weight", types), out[0]
        if not _known(w, y):
            return 0
        return math.prod(y) * w[-1]
    if t == "matmul":
        x, y = _arg(op, "x", types), out[0]
        if not _known(x, y) or not x:
            return 0
        transpose_x = _scalar(op, "transpose_x", consts, 0)
        k = x[-2] if transpose_x and len(x) > 1 else x[-1]
        return math.prod(y) * k
    if t == "einsum":
        operands = [types.get(b.name) for b in op.inputs["values"].arguments if b.WhichOneof("binding") == "name"] \
            if "values" in op.inputs else []
        equation = _string(op, "equation", consts)
        lhs = equation.replace(" ", "").split("->")[0].split(",")
        if len(operands) != 2 or len(lhs) != 2 or not _known(*operands):
            return 0
        extent = {}
        for subs, dims in zip(lhs, operands):
            for ch, d in zip(subs, dims):
                extent[ch] = d
        return math.prod(extent.values())
    if t == "lstm":
        x, w_ih = _arg(op, "x", types), _arg(op, "weight_ih", types)
        w_hh = _arg(op, "weight_hh", types)
        if not _known(x, w_ih, w_hh):
            return 0
        # x (steps, batch, input); weights (4H, I) and (4H, H) per step, sample and direction
        steps, batch, directions = x[0], x[1] if len(x) > 1 else 1, 2 if "weight_ih_back" in op.inputs else 1
        return steps * batch * directions * (math.prod(w_ih) + math.prod(w_hh))
    return 0


def function_macs(fn) -> dict:
    """{"total": MACs, "by_op": {op type: MACs}} of one function of a saved ML Program's spec."""
    ops = function_ops(fn)
    types = _types(fn, ops)
    consts = {op.outputs[0].name: op.attributes["val"] for op in ops
              if op.type == "const" and "val" in op.attributes and op.outputs}
    by_op: dict[str, int] = {}
    for op in ops:
        if op.type in COUNTED:
            n = op_macs(op, types, consts)
            if n:
                by_op[op.type] = by_op.get(op.type, 0) + n
    return {"total": sum(by_op.values()), "by_op": dict(sorted(by_op.items()))}
