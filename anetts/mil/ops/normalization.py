"""layer_norm, instance_norm, batch_norm, l2_norm (MIL ``iOS15/normalization.py``).

Statistics are computed in fp32 (biased variance, eps added to the variance) and the
normalized result is rounded once to the declared dtype.  Note that real fp16
hardware may accumulate these statistics in fp16; a program whose activations are
large enough for sum(x^2) to overflow fp16 can behave worse on device than here.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import Kernel, Node, Unsupported, register
from ._util import norm_axes, widen


@register("layer_norm")
def _layer_norm(node: Node) -> Kernel:
    rank = node.input_rank("x")
    if rank is None:
        raise Unsupported("input rank unknown")
    axes = sorted(norm_axes(node.ints("axes"), rank)) if node.has("axes") else list(range(rank))
    eps = node.float("epsilon", 1e-5) if node.has("epsilon") else 1e-5
    od = node.out_dtype
    trailing = axes == list(range(rank - len(axes), rank))

    def run(x, gamma, beta):
        xf = widen(x)
        if trailing:
            shape = tuple(xf.shape[rank - len(axes):])
            g = None if gamma is None else widen(gamma).reshape(shape)
            b = None if beta is None else widen(beta).reshape(shape)
            return F.layer_norm(xf, shape, g, b, eps).to(od)
        mean = xf.mean(dim=axes, keepdim=True)
        d = xf - mean
        var = (d * d).mean(dim=axes, keepdim=True)
        y = d / torch.sqrt(var + eps)
        pshape = [xf.shape[i] if i in axes else 1 for i in range(rank)]
        if gamma is not None:
            y = y * widen(gamma).reshape(pshape)
        if beta is not None:
            y = y + widen(beta).reshape(pshape)
        return y.to(od)

    return Kernel(run, ["x", node.weight("gamma"), node.weight("beta")])


@register("instance_norm")
def _instance_norm(node: Node) -> Kernel:
    eps = node.float("epsilon", 1e-5) if node.has("epsilon") else 1e-5
    od = node.out_dtype

    def run(x, gamma, beta):
        xf = widen(x)
        y = F.instance_norm(xf, None, None, gamma, beta, True, 0.0, eps)
        return y.to(od)

    return Kernel(run, ["x", node.weight("gamma"), node.weight("beta")])


@register("batch_norm")
def _batch_norm(node: Node) -> Kernel:
    eps = node.float("epsilon", 1e-5) if node.has("epsilon") else 1e-5
    od = node.out_dtype

    def run(x, mean, var, gamma, beta):
        y = F.batch_norm(widen(x), widen(mean), widen(var), gamma, beta, False, 0.0, eps)
        return y.to(od)

    return Kernel(
        run,
        ["x", node.weight("mean"), node.weight("variance"), node.weight("gamma"), node.weight("beta")],
    )


@register("l2_norm")
def _l2_norm(node: Node) -> Kernel:
    eps = node.float("epsilon", 1e-6) if node.has("epsilon") else 1e-6
    od = node.out_dtype

    def run(x):
        xf = widen(x)
        axes = list(range(max(0, xf.dim() - 3), xf.dim()))
        ss = (xf * xf).sum(dim=axes, keepdim=True)
        return (xf / torch.sqrt(ss + eps)).to(od)

    return Kernel(run, ["x"])
