"""conv, conv_transpose and pooling (MIL ``iOS15/conv.py``, ``iOS15/pool.py``).

Padding semantics (the coremltools op docs are ambiguous here; we follow the backend
mapping ``same -> BOTTOM_RIGHT_HEAVY``, ``same_lower -> TOP_LEFT_HEAVY`` and the
output-size formula of ``_utils.aggregated_pad``):

* ``valid``: no padding.  ``custom``: ``pad[2i]`` before / ``pad[2i+1]`` after dim i.
* ``same``: total pad ``max(0, (ceil(in/s)-1)*s + (k-1)*d + 1 - in)``; the odd
  element goes *after* (TF "SAME").  ``same_lower`` puts it *before*.

``conv_transpose`` is computed as the full ("valid") transposed convolution, then
cropped: ``pad[2i]`` elements are dropped in front (``custom``), ``(full-out)//2`` for
``same``; the length is ``output_shape`` when given (zero-extended if longer than the
full result, like torch's ``output_padding``), else the documented formula.  Bias is
added after cropping.

Weights of fp16 programs are widened to fp32 once at load time (a program too large for
that keeps them fp16, and ``conv`` widens them at each call: a 1x1 kernel, how Linear layers are
laid out for the ANE, a block of output channels at a time, ``by_output_blocks``); the
convolution runs in fp32 and its result is rounded once to fp16.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..registry import Kernel, Node, Unsupported, register
from ._util import by_output_blocks, widen

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


def _same_pads(in_sizes, kernel, strides, dilations, lower: bool) -> list[int]:
    pads = []
    for i, k, s, d in zip(in_sizes, kernel, strides, dilations):
        eff = (k - 1) * d + 1
        total = max(0, (math.ceil(i / s) - 1) * s + eff - i)
        small, big = total // 2, total - total // 2
        pads += [big, small] if lower else [small, big]
    return pads


class _PadPlan:
    """Resolves ``pad_type``/``pad`` into explicit per-dim (before, after) pads."""

    def __init__(self, node: Node, nsp: int, kernel, strides, dilations):
        self.pad_type = node.str("pad_type", "valid") if node.has("pad_type") else "valid"
        if self.pad_type not in ("valid", "custom", "same", "same_lower"):
            raise Unsupported(f"pad_type {self.pad_type!r}")
        self.custom = node.ints("pad", [0] * 2 * nsp) if node.has("pad") else [0] * 2 * nsp
        if len(self.custom) != 2 * nsp:
            raise Unsupported(f"pad has {len(self.custom)} values for {nsp} spatial dims")
        self.kernel, self.strides, self.dilations = kernel, strides, dilations
        self._cache: dict[tuple, list[int]] = {}

    def pads(self, in_sizes) -> list[int]:
        if self.pad_type == "valid":
            return [0] * (2 * len(in_sizes))
        if self.pad_type == "custom":
            return self.custom
        key = tuple(in_sizes)
        p = self._cache.get(key)
        if p is None:
            p = _same_pads(in_sizes, self.kernel, self.strides, self.dilations, self.pad_type == "same_lower")
            self._cache[key] = p
        return p


def _apply_pads(x: torch.Tensor, pads: list[int], value: float = 0.0):
    """Pad spatial dims explicitly; returns (x, symmetric padding for torch or None)."""
    nsp = len(pads) // 2
    if all(pads[2 * i] == pads[2 * i + 1] for i in range(nsp)):
        return x, [pads[2 * i] for i in range(nsp)]
    torch_pads = []
    for i in reversed(range(nsp)):
        torch_pads += [pads[2 * i], pads[2 * i + 1]]
    return F.pad(x, torch_pads, value=value), [0] * nsp


def _explicit(x: torch.Tensor, pads: list[int], value: float) -> torch.Tensor:
    if not any(pads):
        return x
    torch_pads = []
    for i in reversed(range(len(pads) // 2)):
        torch_pads += [pads[2 * i], pads[2 * i + 1]]
    return F.pad(x, torch_pads, value=value)


def _spatial_params(node: Node, nsp: int):
    strides = node.ints("strides", [1] * nsp) if node.has("strides") else [1] * nsp
    dilations = node.ints("dilations", [1] * nsp) if node.has("dilations") else [1] * nsp
    groups = node.int("groups", 1) if node.has("groups") else 1
    return strides, dilations, groups


@register("conv")
def _conv(node: Node) -> Kernel:
    wt = node.input_type("weight")
    if wt is None or wt.shape is None:
        raise Unsupported("weight rank unknown")
    nsp = len(wt.shape) - 2
    if nsp not in _CONV:
        raise Unsupported(f"{nsp}-d convolution")
    kernel = list(wt.shape[2:])
    strides, dilations, groups = _spatial_params(node, nsp)
    plan = _PadPlan(node, nsp, kernel, strides, dilations)
    conv = _CONV[nsp]
    od = node.out_dtype
    # a 1x1 weight kept fp16 (a large program: Node.weight) is widened a block at a time at each call;
    # larger kernels are widened whole (torch picks another algorithm per channel count: 1 ulp apart)
    blocked = (not node.widen_weights and node.is_const("weight") and node.input_dtype("weight") == "fp16"
               and groups == 1 and all(k == 1 for k in kernel))

    def run(x, w, b):
        pads = plan.pads(x.shape[2:])
        xx, sym = _apply_pads(widen(x), pads)
        if blocked:
            y = by_output_blocks(w, b, lambda wb, bb: conv(xx, wb, bb, strides, sym, dilations, 1), axis=1)
        else:
            y = conv(xx, widen(w), None if b is None else widen(b), strides, sym, dilations, groups)
        return y.to(od)

    return Kernel(run, ["x", node.weight("weight"), node.weight("bias")])


@register("conv_transpose")
def _conv_transpose(node: Node) -> Kernel:
    wt = node.input_type("weight")
    if wt is None or wt.shape is None:
        raise Unsupported("weight rank unknown")
    nsp = len(wt.shape) - 2
    if nsp not in _CONVT:
        raise Unsupported(f"{nsp}-d transposed convolution")
    strides, dilations, groups = _spatial_params(node, nsp)
    pad_type = node.str("pad_type", "valid") if node.has("pad_type") else "valid"
    if pad_type not in ("valid", "custom", "same", "same_lower"):
        raise Unsupported(f"pad_type {pad_type!r}")
    custom = node.ints("pad", [0] * 2 * nsp) if node.has("pad") else [0] * 2 * nsp
    out_shape = node.ints("output_shape") if node.has("output_shape") else None
    convt = _CONVT[nsp]
    od = node.out_dtype

    def crop(full_sizes, in_sizes):
        before, lengths = [], []
        for i in range(nsp):
            full = full_sizes[i]
            if out_shape is not None:
                n = out_shape[2 + i]
            elif pad_type == "custom":
                n = full - custom[2 * i] - custom[2 * i + 1]
            elif pad_type in ("same", "same_lower"):
                n = in_sizes[i] * strides[i]
            else:
                n = full
            if pad_type == "custom":
                b = custom[2 * i]
            elif pad_type == "same":
                b = max(0, full - n) // 2
            elif pad_type == "same_lower":
                b = max(0, full - n) - max(0, full - n) // 2
            else:
                b = 0
            before.append(b)
            lengths.append(n)
        return before, lengths

    def run(x, w, b):
        y = convt(widen(x), widen(w), None, strides, 0, 0, groups, dilations)
        before, lengths = crop(y.shape[2:], x.shape[2:])
        for i in range(nsp):
            d = 2 + i
            start, n = before[i], lengths[i]
            avail = y.shape[d] - start
            if n <= avail:
                y = y.narrow(d, start, n)
            else:  # zero-extend (torch's output_padding positions receive no input)
                y = y.narrow(d, start, avail)
                pad = [0, 0] * (y.dim() - d - 1) + [0, n - avail]
                y = F.pad(y, pad)
        if b is not None:
            y = y + widen(b).reshape((1, -1) + (1,) * nsp)
        return y.to(od)

    return Kernel(run, ["x", node.weight("weight"), node.weight("bias")])


def _pool(node: Node, kind: str) -> Kernel:
    kernel = node.ints("kernel_sizes")
    nsp = len(kernel)
    if nsp not in _AVG:
        raise Unsupported(f"{nsp}-d pooling")
    strides = node.ints("strides", [1] * nsp) if node.has("strides") else [1] * nsp
    if node.has("ceil_mode") and node.bool("ceil_mode"):
        raise Unsupported("ceil_mode=True")
    plan = _PadPlan(node, nsp, kernel, strides, [1] * nsp)
    exclude = node.bool("exclude_padding_from_average", False) if node.has("exclude_padding_from_average") else False
    od = node.out_dtype

    def run(x):
        pads = plan.pads(x.shape[2:])
        xw = widen(x)
        if kind == "max":
            return _MAX[nsp](_explicit(xw, pads, float("-inf")), kernel, strides).to(od)
        if kind == "l2":
            y = _AVG[nsp](_explicit(xw * xw, pads, 0.0), kernel, strides) * math.prod(kernel)
            return torch.sqrt(y).to(od)
        y = _AVG[nsp](_explicit(xw, pads, 0.0), kernel, strides)
        if exclude and any(pads):
            ones = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=xw.dtype)
            y = y / _AVG[nsp](_explicit(ones, pads, 0.0), kernel, strides)
        return y.to(od)

    return Kernel(run, ["x"])


@register("avg_pool")
def _avg_pool(node):
    return _pool(node, "avg")


@register("max_pool")
def _max_pool(node):
    return _pool(node, "max")


@register("l2_pool")
def _l2_pool(node):
    return _pool(node, "l2")
