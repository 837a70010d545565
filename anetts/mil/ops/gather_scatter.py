"""gather, gather_along_axis, gather_nd, scatter, scatter_along_axis, scatter_nd.

Index rules depend on the opset (coremltools ``iOS15``/``iOS16``/``iOS17``
``scatter_gather.py``):

* iOS15/16: indices may be negative (``-D <= i < D``) and wrap python-style.
* iOS17+: negative indices are *out of bounds*.  With ``validate_indices=True`` Core ML
  raises; with False the result is undefined.  A reference executor cannot reproduce
  "undefined", so out-of-bound indices always raise :class:`MilRuntimeError` here
  (with a message saying which case applies) rather than silently producing values
  the device would not.

``scatter*`` modes: update, add, sub, mul, div, max, min.  Duplicate indices with
``update`` are resolved last-write-wins here (undefined in MIL).
"""
from __future__ import annotations

import torch

from ..errors import MilRuntimeError
from ..registry import Kernel, Node, Unsupported, register
from ._util import norm_axis

_MODES = ("update", "add", "sub", "mul", "div", "max", "min")


def _index_checker(node: Node):
    allow_negative = not node.opset_at_least(17)
    validate = node.bool("validate_indices", False) if node.has("validate_indices") else False
    name = node.type

    def check(idx: torch.Tensor, size: int) -> torch.Tensor:
        idx = idx.to(torch.long)
        if idx.numel() == 0:
            return idx
        lo, hi = int(idx.min()), int(idx.max())
        low_ok = -size if allow_negative else 0
        if lo < low_ok or hi >= size:
            why = "validate_indices=True" if validate else "undefined behaviour in Core ML"
            rule = f"[{low_ok}, {size})"
            raise MilRuntimeError(f"{name}: index out of bounds {rule} (min {lo}, max {hi}; {why})")
        if lo < 0:
            idx = torch.where(idx < 0, idx + size, idx)
        return idx

    return check


# torch's CPU gather kernels take no unsigned type but uint8; coremltools narrows index tensors it
# gathers from (argsort's output) to uint16. Gather those as int64 and cast back: exact.
_WIDENED = {torch.uint16, torch.uint32, torch.uint64}


def _widened(gather):
    def run(x, *args):
        if x.dtype in _WIDENED:
            return gather(x.to(torch.int64), *args).to(x.dtype)
        return gather(x, *args)

    return run


@register("gather")
def _gather(node: Node) -> Kernel:
    axis = node.int("axis", 0) if node.has("axis") else 0
    batch_dims = node.int("batch_dims", 0) if node.has("batch_dims") else 0
    check = _index_checker(node)

    def gather0(x, idx, a):
        flat = torch.index_select(x, a, idx.reshape(-1))
        return flat.reshape(tuple(x.shape[:a]) + tuple(idx.shape) + tuple(x.shape[a + 1 :]))

    def run(x, indices):
        a = norm_axis(axis, x.dim())
        idx = check(indices, x.shape[a])
        if batch_dims == 0:
            return gather0(x, idx, a)
        bshape = tuple(x.shape[:batch_dims])
        nb = 1
        for d in bshape:
            nb *= d
        xb = x.reshape((nb,) + tuple(x.shape[batch_dims:]))
        ib = idx.reshape((nb,) + tuple(idx.shape[batch_dims:]))
        outs = [gather0(xb[i], ib[i], a - batch_dims) for i in range(nb)]
        out = torch.stack(outs, 0)
        return out.reshape(bshape + tuple(out.shape[1:]))

    return Kernel(_widened(run), ["x", "indices"])


@register("gather_along_axis")
def _gather_along_axis(node: Node) -> Kernel:
    axis = node.int("axis", 0) if node.has("axis") else 0
    check = _index_checker(node)

    def run(x, indices):
        a = norm_axis(axis, x.dim())
        return torch.gather(x, a, check(indices, x.shape[a]))

    return Kernel(_widened(run), ["x", "indices"])


@register("gather_nd")
def _gather_nd(node: Node) -> Kernel:
    batch_dims = node.int("batch_dims", 0) if node.has("batch_dims") else 0
    check = _index_checker(node)

    def gnd(x, idx):
        depth = idx.shape[-1]
        flat = idx.reshape(-1, depth)
        cols = [check(flat[:, j], x.shape[j]) for j in range(depth)]
        out = x[tuple(cols)]
        return out.reshape(tuple(idx.shape[:-1]) + tuple(x.shape[depth:]))

    def run(x, indices):
        if batch_dims == 0:
            return gnd(x, indices)
        bshape = tuple(x.shape[:batch_dims])
        nb = 1
        for d in bshape:
            nb *= d
        xb = x.reshape((nb,) + tuple(x.shape[batch_dims:]))
        ib = indices.reshape((nb,) + tuple(indices.shape[batch_dims:]))
        out = torch.stack([gnd(xb[i], ib[i]) for i in range(nb)], 0)
        return out.reshape(bshape + tuple(out.shape[1:]))

    return Kernel(run, ["x", "indices"])


def _mode(node: Node, default: str) -> str:
    mode = node.str("mode", default) if node.has("mode") else default
    if mode not in _MODES:
        raise Unsupported(f"mode={mode!r}")
    return mode


def _combine(mode: str, old: torch.Tensor, upd: torch.Tensor) -> torch.Tensor:
    if mode == "update":
        return upd
    if mode == "add":
        return old + upd
    if mode == "sub":
        return old - upd
    if mode == "mul":
        return old * upd
    if mode == "div":
        return old / upd
    if mode == "max":
        return torch.maximum(old, upd)
    return torch.minimum(old, upd)


def _scatter_rows(data2: torch.Tensor, rows: torch.Tensor, upd2: torch.Tensor, mode: str) -> torch.Tensor:
    """data2[rows[k]] = combine(data2[rows[k]], upd2[k]) for k in order (sequential so
    duplicate indices accumulate the way a scalar loop would)."""
    out = data2.clone()
    if mode in ("update", "add") and rows.numel():
        if mode == "update":
            out.index_copy_(0, rows, upd2)
        else:
            out.index_add_(0, rows, upd2)
        return out
    for k in range(rows.numel()):
        r = int(rows[k])
        out[r] = _combine(mode, out[r], upd2[k])
    return out


@register("scatter")
def _scatter(node: Node) -> Kernel:
    axis = node.int("axis", 0) if node.has("axis") else 0
    mode = _mode(node, "add")
    check = _index_checker(node)

    def run(data, indices, updates):
        a = norm_axis(axis, data.dim())
        idx = check(indices.reshape(-1), data.shape[a])
        d2 = data.movedim(a, 0)
        u2 = updates.movedim(a, 0).to(data.dtype)
        return _scatter_rows(d2, idx, u2, mode).movedim(0, a).contiguous()

    return Kernel(run, ["data", "indices", "updates"])


@register("scatter_along_axis")
def _scatter_along_axis(node: Node) -> Kernel:
    axis = node.int("axis", 0) if node.has("axis") else 0
    mode = _mode(node, "add")
    check = _index_checker(node)
    reduce = {"mul": "prod", "max": "amax", "min": "amin"}

    def run(data, indices, updates):
        a = norm_axis(axis, data.dim())
        idx = check(indices, data.shape[a])
        upd = updates.to(data.dtype)
        if mode == "update":
            return data.scatter(a, idx, upd)
        if mode == "add":
            return data.scatter_add(a, idx, upd)
        if mode == "sub":
            return data.scatter_add(a, idx, -upd)
        if mode == "div":
            return data.scatter_reduce(a, idx, 1.0 / upd, reduce="prod", include_self=True)
        return data.scatter_reduce(a, idx, upd, reduce=reduce[mode], include_self=True)

    return Kernel(run, ["data", "indices", "updates"])


@register("scatter_nd")
def _scatter_nd(node: Node) -> Kernel:
    mode = _mode(node, "add")
    check = _index_checker(node)

    def run(data, indices, updates):
        depth = indices.shape[-1]
        flat = indices.reshape(-1, depth)
        lin = torch.zeros(flat.shape[0], dtype=torch.long)
        for j in range(depth):
            lin = lin * data.shape[j] + check(flat[:, j], data.shape[j])
        rest = tuple(data.shape[depth:])
        d2 = data.reshape((-1,) + rest)
        u2 = updates.reshape((-1,) + rest).to(data.dtype)
        return _scatter_rows(d2, lin, u2, mode).reshape(data.shape)

    return Kernel(run, ["data", "indices", "updates"])
