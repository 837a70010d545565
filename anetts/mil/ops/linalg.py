"""linear, matmul, einsum, scaled_dot_product_attention.

Products and sums accumulate in fp32 and the result is rounded once to the declared dtype.
Const weights of fp16 programs are widened once, at load time; a program too large for that
keeps them fp16 (``Node.weight``), and ``linear`` widens them a block at a time (``by_output_blocks``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import Kernel, Node, Unsupported, register
from ._util import F32, by_output_blocks, widen


@register("linear")
def _linear(node: Node) -> Kernel:
    od = node.out_dtype
    # a weight kept fp16 (a large program: Node.weight) is widened a block at a time at each call
    blocked = not node.widen_weights and node.is_const("weight") and node.input_dtype("weight") == "fp16"

    def run(x, w, b):
        if blocked and x.is_floating_point():
            k = w.shape[1]
            x2 = widen(x).reshape(-1, k)
            y = by_output_blocks(w, b, lambda wb, bb: F.linear(x2, wb, bb), axis=-1).reshape(*x.shape[:-1], -1)
        elif x.is_floating_point():
            y = F.linear(widen(x), widen(w), None if b is None else widen(b))
        else:
            y = torch.matmul(x, w.transpose(0, 1)) + (0 if b is None else b)
        return y.to(od)

    return Kernel(run, ["x", node.weight("weight"), node.weight("bias")])


@register("matmul")
def _matmul(node: Node) -> Kernel:
    od = node.out_dtype
    tx = node.bool("transpose_x", False) if node.has("transpose_x") else False
    ty = node.bool("transpose_y", False) if node.has("transpose_y") else False

    def run(x, y):
        if tx and x.dim() >= 2:
            x = x.transpose(-1, -2)
        if ty and y.dim() >= 2:
            y = y.transpose(-1, -2)
        if x.is_floating_point():
            r = torch.matmul(widen(x), widen(y))
        else:
            r = torch.matmul(x.to(torch.int64), y.to(torch.int64))
        return r.to(od)

    return Kernel(run, [node.weight("x"), node.weight("y")])


@register("einsum")
def _einsum(node: Node) -> Kernel:
    eq = node.str("equation")
    od = node.out_dtype

    def run(values):
        return torch.einsum(eq, *[widen(v) for v in values]).to(od)

    return Kernel(run, ["*values"])


@register("scaled_dot_product_attention")
def _sdpa(node: Node) -> Kernel:
    od = node.out_dtype

    def run(q, k, v, mask):
        q, k, v = q.to(F32), k.to(F32), v.to(F32)
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.to(F32)
        scores = torch.matmul(q, k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
        if mask is not None:
            if mask.dtype == torch.bool:
                scores = scores.masked_fill(~mask, float("-inf"))
            else:
                scores = scores + mask
        return torch.matmul(torch.softmax(scores, -1), v).to(od)

    if node.has("attn_mask") and node.input_dtype("attn_mask") not in ("bool", "fp16", "fp32"):
        raise Unsupported(f"attn_mask dtype {node.input_dtype('attn_mask')}")
    return Kernel(run, ["query", "key", "value", "attn_mask"])
