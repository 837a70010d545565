"""reduce_* and reduce_argmax/argmin (MIL ``iOS15/reduction.py``).

``axes`` absent means all axes; ``keep_dims`` defaults to False.  Float reductions
accumulate in fp32 (fp16 inputs are widened) and round once; int32 sums stay int32.
"""
from __future__ import annotations

import torch

from ..registry import Kernel, Node, Unsupported, register
from ._util import F16, norm_axis, widen


def _sum(x, axes, keep):
    return torch.sum(x, dim=axes, keepdim=keep)


def _mean(x, axes, keep):
    return torch.mean(x, dim=axes, keepdim=keep)


def _prod(x, axes, keep):
    for a in sorted(axes, reverse=True):
        x = torch.prod(x, dim=a, keepdim=keep)
    return x


def _max(x, axes, keep):
    return torch.amax(x, dim=axes, keepdim=keep)


def _min(x, axes, keep):
    return torch.amin(x, dim=axes, keepdim=keep)


def _l1(x, axes, keep):
    return torch.sum(torch.abs(x), dim=axes, keepdim=keep)


def _l2(x, axes, keep):
    return torch.sqrt(torch.sum(x * x, dim=axes, keepdim=keep))


def _sum_square(x, axes, keep):
    return torch.sum(x * x, dim=axes, keepdim=keep)


def _log_sum(x, axes, keep):
    return torch.log(torch.sum(x, dim=axes, keepdim=keep))


def _log_sum_exp(x, axes, keep):
    return torch.logsumexp(x, dim=axes, keepdim=keep)


_REDUCE = {
    "reduce_sum": _sum,
    "reduce_mean": _mean,
    "reduce_prod": _prod,
    "reduce_max": _max,
    "reduce_min": _min,
    "reduce_l1_norm": _l1,
    "reduce_l2_norm": _l2,
    "reduce_sum_square": _sum_square,
    "reduce_log_sum": _log_sum,
    "reduce_log_sum_exp": _log_sum_exp,
}


def _build_reduce(node: Node) -> Kernel:
    fn = _REDUCE[node.type]
    keep = node.bool("keep_dims", False) if node.has("keep_dims") else False
    axes_c = node.ints("axes") if node.has("axes") else None
    od = node.out_dtype

    def run(x):
        rank = x.dim()
        axes = list(range(rank)) if axes_c is None else [norm_axis(a, rank) for a in axes_c]
        if not axes:
            return x
        if x.dtype == F16 and fn in (_sum, _mean):
            # accumulate in fp32 straight from the fp16 data (no widened copy)
            fn2 = torch.sum if fn is _sum else torch.mean
            return fn2(x, dim=axes, keepdim=keep, dtype=torch.float32).to(od)
        xin = widen(x)
        if not xin.is_floating_point() and fn in (_mean, _l2, _log_sum, _log_sum_exp):
            xin = xin.double()
        y = fn(xin, axes, keep)
        return y.to(od)

    return Kernel(run, ["x"])


register(*_REDUCE)(_build_reduce)


@register("reduce_argmax", "reduce_argmin")
def _argext(node: Node) -> Kernel:
    axis = node.int("axis", -1) if node.has("axis") else -1
    keep = node.bool("keep_dims", False) if node.has("keep_dims") else False
    fn = torch.argmax if node.type == "reduce_argmax" else torch.argmin
    od = node.out_dtype
    if node.has("output_dtype") and node.str("output_dtype") not in ("int32", "uint16"):
        raise Unsupported(f"output_dtype {node.str('output_dtype')}")

    def run(x):
        # first occurrence wins on ties, like numpy's argmax used by value_inference
        return fn(widen(x), dim=norm_axis(axis, x.dim()), keepdim=keep).to(od)

    return Kernel(run, ["x"])
