"""upsample_nearest_neighbor, upsample_bilinear, resize_nearest_neighbor, resize_bilinear.

All act on the last two dims.  Sampling grids follow the op docs
(``iOS15/image_resizing.py``, ``iOS16`` adds ``half_pixel_centers``):

* ``upsample_bilinear`` recomputes the scale from the sizes (torch's
  ``recompute_scale_factor=True``): ``align_corners`` -> ``i*(in-1)/(out-1)``;
  otherwise ``(i+0.5)*in/out - 0.5`` with half_pixel_centers (default
  ``not align_corners``) or ``i*in/out`` without; clamped to ``[0, in-1]``.
* ``resize_bilinear`` sampling modes STRICT_ALIGN_CORNERS / ALIGN_CORNERS / DEFAULT /
  OFFSET_CORNERS / UNALIGN_CORNERS as documented.
* nearest neighbour picks ``floor(i * in / out)``.

Output sizes are ``floor(in * scale)``; interpolation runs in fp32.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..registry import Kernel, Node, Unsupported, register
from ._util import widen


def _lerp_axis(x: torch.Tensor, dim: int, grid: np.ndarray) -> torch.Tensor:
    n = x.shape[dim]
    g = np.clip(grid, 0.0, n - 1).astype(np.float32)
    lo = np.floor(g).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    w = g - lo.astype(np.float32)
    shape = [1] * x.dim()
    shape[dim] = len(g)
    wt = torch.from_numpy(w).reshape(shape)
    a = torch.index_select(x, dim, torch.from_numpy(lo))
    b = torch.index_select(x, dim, torch.from_numpy(hi))
    return a * (1 - wt) + b * wt


def _nearest_axis(x: torch.Tensor, dim: int, out: int) -> torch.Tensor:
    n = x.shape[dim]
    if out == n:
        return x
    if out % n == 0:
        return torch.repeat_interleave(x, out // n, dim=dim)
    idx = np.minimum(np.floor(np.arange(out) * (n / out)).astype(np.int64), n - 1)
    return torch.index_select(x, dim, torch.from_numpy(idx))


def _out_size(n: int, scale: float) -> int:
    # floor(n * scale) with the fp32 scale, exactly as the op's type inference does
    return int(math.floor(n * scale))


def _grid_upsample(n_in: int, n_out: int, align_corners: bool, half_pixel: bool) -> np.ndarray:
    # fp32 arithmetic, as an fp32 kernel (torch's, Core ML's CPU one) computes it: with
    # long sequences the sampling positions' rounding is visible (e.g. 300x upsampling
    # of a phase ramp), so float64 grids would be "too exact".
    f = np.float32
    i = np.arange(n_out, dtype=f)
    if align_corners:
        return i * f((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(n_out, dtype=f)
    sp = f(n_in / n_out)
    return (i + f(0.5)) * sp - f(0.5) if half_pixel else i * sp


def _grid_resize(n_in: int, n_out: int, mode: str) -> np.ndarray:
    i = np.arange(n_out, dtype=np.float64)
    if mode in ("STRICT_ALIGN_CORNERS", "ALIGN_CORNERS"):
        if n_out == 1:
            return np.array([(n_in - 1) / 2.0 if mode == "ALIGN_CORNERS" else 0.0])
        return i * ((n_in - 1) / (n_out - 1))
    if mode == "DEFAULT":
        return i * ((n_in - n_in / n_out) / (n_out - 1)) if n_out > 1 else np.zeros(1)
    if mode == "OFFSET_CORNERS":
        delta = max(1, n_in - 1) / n_out
        return 0.5 * delta + i * delta
    if mode == "UNALIGN_CORNERS":
        sp = n_in / n_out
        return (i + 0.5) * sp - 0.5
    raise Unsupported(f"sampling_mode={mode!r}")


def _declared_hw(node: Node):
    s = node.out_shape
    if s is None or len(s) < 2:
        return None, None
    return s[-2], s[-1]


@register("upsample_nearest_neighbor")
def _upsample_nn(node: Node) -> Kernel:
    sh = node.float("scale_factor_height", 1.0) if node.has("scale_factor_height") else 1.0
    sw = node.float("scale_factor_width", 1.0) if node.has("scale_factor_width") else 1.0
    dh, dw = _declared_hw(node)

    def run(x):
        h, w = x.shape[-2], x.shape[-1]
        oh = dh if dh is not None else _out_size(h, sh)
        ow = dw if dw is not None else _out_size(w, sw)
        return _nearest_axis(_nearest_axis(x, x.dim() - 2, oh), x.dim() - 1, ow)

    return Kernel(run, ["x"])


@register("resize_nearest_neighbor")
def _resize_nn(node: Node) -> Kernel:
    th, tw = node.int("target_size_height"), node.int("target_size_width")
    return Kernel(lambda x: _nearest_axis(_nearest_axis(x, x.dim() - 2, th), x.dim() - 1, tw), ["x"])


@register("upsample_bilinear")
def _upsample_bilinear(node: Node) -> Kernel:
    sh = node.float("scale_factor_height", 1.0) if node.has("scale_factor_height") else 1.0
    sw = node.float("scale_factor_width", 1.0) if node.has("scale_factor_width") else 1.0
    align = node.bool("align_corners", True) if node.has("align_corners") else True
    half = node.bool("half_pixel_centers", not align) if node.has("half_pixel_centers") else not align
    dh, dw = _declared_hw(node)
    od = node.out_dtype
    cache: dict = {}

    def run(x):
        h, w = x.shape[-2], x.shape[-1]
        oh = dh if dh is not None else _out_size(h, sh)
        ow = dw if dw is not None else _out_size(w, sw)
        key = (h, w, oh, ow)
        grids = cache.get(key)
        if grids is None:
            grids = cache[key] = (_grid_upsample(h, oh, align, half), _grid_upsample(w, ow, align, half))
        y = widen(x)
        if oh != h or sh != 1.0:
            y = _lerp_axis(y, y.dim() - 2, grids[0])
        if ow != w or sw != 1.0:
            y = _lerp_axis(y, y.dim() - 1, grids[1])
        return y.to(od)

    return Kernel(run, ["x"])


@register("resize_bilinear")
def _resize_bilinear(node: Node) -> Kernel:
    th = node.int("target_size_height", 1) if node.has("target_size_height") else 1
    tw = node.int("target_size_width", 1) if node.has("target_size_width") else 1
    mode = node.str("sampling_mode", "DEFAULT") if node.has("sampling_mode") else "DEFAULT"
    _grid_resize(2, 2, mode)  # validates the mode at load time
    od = node.out_dtype

    def run(x):
        h, w = x.shape[-2], x.shape[-1]
        y = _lerp_axis(widen(x), x.dim() - 2, _grid_resize(h, th, mode))
        y = _lerp_axis(y, x.dim() - 1, _grid_resize(w, tw, mode))
        return y.to(od)

    return Kernel(run, ["x"])
