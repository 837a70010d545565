"""Shape / layout ops: reshape, transpose, concat, split, slicing, pad, tile, ...

These move data without arithmetic, so they run on the declared dtype directly.
Parameters that MIL allows to be run-time tensors (reshape's shape, slice begin/end,
tile reps, pad amounts, fill shape, ...) are read as python ints when const at load
time, else converted per run.

Notes on semantics (see coremltools ``iOS15/tensor_transformation.py``,
``tensor_operation.py`` and the iOS16-18 overrides):

* ``reshape``: ``-1`` infers; ``0`` copies the input dim at the same index (iOS15/16,
  requires ``len(shape) == rank``) or, from iOS17, the input dim at the same index
  counted from the *right* (``1`` when out of range).
* ``squeeze`` without axes removes all size-1 dims; with axes, non-1 dims are ignored
  (torch behaviour, as the op doc says).
* ``slice_by_index`` is python slicing (negative strides included);
  ``squeeze_mask[i]`` picks the single element at ``begin[i]``.
* ``pad`` lists (before, after) pairs for the *last* ``len(pad)/2`` dims, first pair
  for the outermost of them; ``reflect`` excludes the edge, ``replicate`` repeats it.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import MilRuntimeError
from ..registry import Fixed, Kernel, Node, Unsupported, register
from ._util import ints, norm_axis, scalar, widen


def _static_or_name(node: Node, name: str, conv=lambda v: [int(x) for x in np.asarray(v).reshape(-1)]):
    if node.is_const(name):
        return Fixed(conv(node.const(name)))
    return name


# ------------------------------------------------------------------------ reshape
def _resolve_shape(x_shape, shape, ios17: bool) -> list[int]:
    shape = list(shape)
    rank = len(x_shape)
    if ios17:
        for i, s in enumerate(shape):
            if s == 0:
                j = rank - (len(shape) - i)
                shape[i] = x_shape[j] if 0 <= j < rank else 1
    else:
        if 0 in shape:
            if len(shape) != rank:
                raise MilRuntimeError(f"reshape: shape {shape} has 0 but its length != rank {rank}")
            shape = [x_shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return shape


@register("reshape")
def _reshape(node: Node) -> Kernel:
    shape = node.ints("shape") if node.is_const("shape") else None
    out_shape = node.out_shape
    if shape is not None and out_shape is not None and None not in out_shape and -1 not in shape and 0 not in shape:
        fixed = tuple(shape)
        return Kernel(lambda x: x.reshape(fixed), ["x"])
    # what a 0 in the shape means changed at iOS17; a constant shape without one reads the same in every opset
    ios17 = node.opset_at_least(17) if shape is None or 0 in shape else True

    def run(x, s):
        s = shape if s is None else ints(s)
        return x.reshape(_resolve_shape(tuple(x.shape), s, ios17))

    return Kernel(run, ["x", Fixed(None) if shape is not None else "shape"])


@register("reshape_like")
def _reshape_like(node: Node) -> Kernel:
    begins, ends = node.ints("begins"), node.ints("ends")
    end_masks = node.bools("end_masks")

    def run(x, refs):
        shape = []
        for r, b, e, m in zip(refs, begins, ends, end_masks):
            shape += list(r.shape[b:] if m else r.shape[b:e])
        return x.reshape(shape)

    return Kernel(run, ["x", "*ref_tensors"])


@register("transpose")
def _transpose(node: Node) -> Kernel:
    perm = node.ints("perm")
    return Kernel(lambda x: x.permute(perm), ["x"])


@register("expand_dims")
def _expand_dims(node: Node) -> Kernel:
    axes = node.ints("axes")

    def run(x):
        out_rank = x.dim() + len(axes)
        shape = list(x.shape)
        for a in sorted(norm_axis(a, out_rank) for a in axes):
            shape.insert(a, 1)
        return x.reshape(shape)

    return Kernel(run, ["x"])


@register("squeeze")
def _squeeze(node: Node) -> Kernel:
    axes = node.ints("axes") if node.has("axes") else None

    def run(x):
        if axes is None:
            return x.reshape([d for d in x.shape if d != 1])
        rank = x.dim()
        drop = {norm_axis(a, rank) for a in axes}
        return x.reshape([d for i, d in enumerate(x.shape) if not (i in drop and d == 1)])

    return Kernel(run, ["x"])


@register("flatten2d")
def _flatten2d(node: Node) -> Kernel:
    axis = node.int("axis", 1) if node.has("axis") else 1

    def run(x):
        a = axis + x.dim() if axis < 0 else axis
        return x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:]))

    return Kernel(run, ["x"])


# ---------------------------------------------------------------- concat / split
@register("concat")
def _concat(node: Node) -> Kernel:
    axis = node.int("axis")
    interleave = node.bool("interleave", False) if node.has("interleave") else False

    def run(values):
        if any(v.dim() == 0 for v in values):  # scalars concatenate as 1-element vectors
            values = [v.reshape(1) if v.dim() == 0 else v for v in values]
        if interleave:
            a = norm_axis(axis, values[0].dim())
            st = torch.stack(values, dim=a + 1)
            shape = list(values[0].shape)
            shape[a] *= len(values)
            return st.reshape(shape)
        return torch.cat(values, dim=axis)

    return Kernel(run, ["*values"])


@register("stack")
def _stack(node: Node) -> Kernel:
    axis = node.int("axis")
    return Kernel(lambda values: torch.stack(values, dim=axis), ["*values"])


@register("split")
def _split(node: Node) -> Kernel:
    axis = node.int("axis")
    sizes = node.ints("split_sizes") if node.has("split_sizes") else None
    num = node.int("num_splits") if node.has("num_splits") else None
    n_out = len(node.out_types)

    def run(x):
        a = norm_axis(axis, x.dim())
        if sizes is not None:
            parts = torch.split(x, sizes, dim=a)
        else:
            n = num or n_out
            if x.shape[a] % n:
                raise MilRuntimeError(f"split: dim {x.shape[a]} not divisible by num_splits {n}")
            parts = torch.split(x, x.shape[a] // n, dim=a)
        return tuple(parts)

    return Kernel(run, ["x"])


# ------------------------------------------------------------------------ slicing
def _slices(shape, begin, end, stride, begin_mask, end_mask, squeeze_mask):
    rank = len(shape)
    stride = stride or [1] * rank
    begin_mask = begin_mask or [False] * rank
    end_mask = end_mask or [False] * rank
    squeeze_mask = squeeze_mask or [False] * rank
    out = []
    for i in range(rank):
        if squeeze_mask[i]:
            b = begin[i] + shape[i] if begin[i] < 0 else begin[i]
            if not 0 <= b < shape[i]:
                raise MilRuntimeError(f"slice_by_index: index {begin[i]} out of range for dim {i} of size {shape[i]}")
            out.append((b, b + 1, 1, True))
            continue
        b = None if begin_mask[i] else begin[i]
        e = None if end_mask[i] else end[i]
        start, stop, step = slice(b, e, stride[i]).indices(shape[i])
        out.append((start, stop, step, False))
    return out


def _apply_slices(x: torch.Tensor, plan) -> torch.Tensor:
    y = x
    squeeze = []
    for d, (start, stop, step, sq) in enumerate(plan):
        n = y.shape[d]
        if sq:  # before the whole-dim shortcut: a size-1 dim picked by squeeze_mask still goes
            squeeze.append(d)
        if step == 1:
            if start == 0 and stop >= n:
                continue
            y = y.narrow(d, start, max(0, stop - start))
        elif step > 0:
            idx = [slice(None)] * d + [slice(start, stop, step)]
            y = y[tuple(idx)]
        else:
            idx = torch.arange(start, stop, step, dtype=torch.long)
            y = torch.index_select(y, d, idx) if idx.numel() else y.narrow(d, 0, 0)
    if squeeze:
        y = y.reshape([s for i, s in enumerate(y.shape) if i not in squeeze])
    return y


@register("slice_by_index")
def _slice_by_index(node: Node) -> Kernel:
    stride = node.ints("stride") if node.has("stride") else None
    bm = node.bools("begin_mask") if node.has("begin_mask") else None
    em = node.bools("end_mask") if node.has("end_mask") else None
    sm = node.bools("squeeze_mask") if node.has("squeeze_mask") else None
    cache: dict = {}

    def run(x, begin, end):
        b, e = ints(begin), ints(end)
        key = (tuple(x.shape), tuple(b), tuple(e))
        plan = cache.get(key)
        if plan is None:
            plan = _slices(tuple(x.shape), b, e, stride, bm, em, sm)
            if len(cache) < 64:
                cache[key] = plan
        return _apply_slices(x, plan)

    return Kernel(run, ["x", _static_or_name(node, "begin"), _static_or_name(node, "end")])


@register("slice_by_size")
def _slice_by_size(node: Node) -> Kernel:
    def run(x, begin, size):
        y = x
        for d, (b, s) in enumerate(zip(ints(begin), ints(size))):
            n = y.shape[d]
            b = b + n if b < 0 else b
            length = n - b if s < 0 else s
            if b < 0 or b + length > n:
                raise MilRuntimeError(f"slice_by_size: [{b}, {b + length}) out of range for dim {d} of size {n}")
            if not (b == 0 and length == n):
                y = y.narrow(d, b, length)
        return y

    return Kernel(run, ["x", _static_or_name(node, "begin"), _static_or_name(node, "size")])


@register("slice_update")
def _slice_update(node: Node) -> Kernel:
    stride = node.ints("stride") if node.has("stride") else None
    bm = node.bools("begin_mask") if node.has("begin_mask") else None
    em = node.bools("end_mask") if node.has("end_mask") else None
    sm = node.bools("squeeze_mask") if node.has("squeeze_mask") else None

    def run(x, update, begin, end):
        plan = _slices(tuple(x.shape), ints(begin), ints(end), stride, bm, em, sm)
        shape = [len(range(start, stop, step)) for start, stop, step, _sq in plan]
        out = x.clone()
        if all(step > 0 for _s, _e, step, _sq in plan):
            # basic slicing writes a view: a KV-cache row update costs one copy of the rows,
            # not an index grid the size of the update
            out[tuple(slice(start, stop, step) for start, stop, step, _sq in plan)] = update.reshape(shape).to(x.dtype)
            return out
        idx = [torch.arange(start, stop, step, dtype=torch.long) for start, stop, step, _sq in plan]
        grids = torch.meshgrid(*idx, indexing="ij") if idx else ()
        out[tuple(grids)] = update.reshape(shape).to(x.dtype)
        return out

    return Kernel(run, ["x", "update", _static_or_name(node, "begin"), _static_or_name(node, "end")])


# ---------------------------------------------------------------- tile / pad ...
@register("tile")
def _tile(node: Node) -> Kernel:
    def run(x, reps):
        return x.repeat(ints(reps))

    return Kernel(run, ["x", _static_or_name(node, "reps")])


def _pad_index(n: int, before: int, after: int, mode: str) -> torch.Tensor:
    i = torch.arange(-before, n + after, dtype=torch.long)
    if mode == "replicate":
        return i.clamp(0, n - 1)
    # reflect (edge not repeated)
    if before > n - 1 or after > n - 1:
        raise MilRuntimeError(f"reflect pad ({before}, {after}) too large for dim of size {n}")
    i = i.abs()
    return torch.where(i > n - 1, 2 * (n - 1) - i, i)


@register("pad")
def _pad(node: Node) -> Kernel:
    mode = node.str("mode", "constant") if node.has("mode") else "constant"
    if mode not in ("constant", "reflect", "replicate"):
        raise Unsupported(f"mode={mode!r}")
    cval = node.float("constant_val", 0.0) if node.has("constant_val") else 0.0
    cache: dict = {}

    def run(x, pad):
        pad = ints(pad)
        npad = len(pad) // 2
        rank = x.dim()
        if mode == "constant":
            torch_pads = []
            for i in reversed(range(npad)):
                torch_pads += [pad[2 * i], pad[2 * i + 1]]
            return F.pad(x, torch_pads, value=cval)
        y = x
        for i in range(npad):
            d = rank - npad + i
            b, a = pad[2 * i], pad[2 * i + 1]
            if b == 0 and a == 0:
                continue
            key = (y.shape[d], b, a)
            idx = cache.get(key)
            if idx is None:
                idx = cache[key] = _pad_index(y.shape[d], b, a, mode)
            y = torch.index_select(y, d, idx)
        return y

    return Kernel(run, ["x", _static_or_name(node, "pad")])


@register("reverse")
def _reverse(node: Node) -> Kernel:
    axes = node.ints("axes") if node.has("axes") else None

    def run(x):
        dims = list(range(x.dim())) if axes is None else [norm_axis(a, x.dim()) for a in axes]
        return torch.flip(x, dims) if dims else x

    return Kernel(run, ["x"])


@register("reverse_sequence")
def _reverse_sequence(node: Node) -> Kernel:
    seq_axis = node.int("seq_axis", 0) if node.has("seq_axis") else 0
    batch_axis = node.int("batch_axis", 0) if node.has("batch_axis") else 0

    def run(x, lengths):
        sa, ba = norm_axis(seq_axis, x.dim()), norm_axis(batch_axis, x.dim())
        out = x.clone()
        for b, n in enumerate(ints(lengths)):
            if n <= 0:
                continue
            src = x.select(ba, b)
            sa_b = sa - (1 if sa > ba else 0)
            rev = torch.flip(src.narrow(sa_b, 0, n), [sa_b])
            out.select(ba, b).narrow(sa_b, 0, n).copy_(rev)
        return out

    return Kernel(run, ["x", "lengths"])


@register("range_1d")
def _range_1d(node: Node) -> Kernel:
    od = node.out_dtype

    def run(start, end, step):
        s, e, st = scalar(start), scalar(end), scalar(step)
        n = max(0, math.ceil((e - s) / st))
        return (s + torch.arange(n, dtype=torch.float64) * st).to(od)

    return Kernel(run, ["start", "end", "step"])


@register("fill")
def _fill(node: Node) -> Kernel:
    od = node.out_dtype
    value = scalar(node.const("value")) if node.has("value") else 0.0

    def run(shape):
        return torch.full(ints(shape), value, dtype=od)

    return Kernel(run, [_static_or_name(node, "shape")])


@register("fill_like")
def _fill_like(node: Node) -> Kernel:
    od = node.out_dtype
    value = scalar(node.const("value")) if node.has("value") else 0.0
    return Kernel(lambda ref: torch.full(tuple(ref.shape), value, dtype=od), ["ref_tensor"])


@register("shape")
def _shape(node: Node) -> Kernel:
    od = node.out_dtype
    return Kernel(lambda x: torch.tensor(list(x.shape), dtype=od), ["x"])


@register("non_zero")
def _non_zero(node: Node) -> Kernel:
    od = node.out_dtype
    return Kernel(lambda x: torch.nonzero(x).to(od), ["x"])


@register("cumsum")
def _cumsum(node: Node) -> Kernel:
    axis = node.int("axis", 0) if node.has("axis") else 0
    exclusive = node.bool("exclusive", False) if node.has("exclusive") else False
    reverse = node.bool("reverse", False) if node.has("reverse") else False
    od = node.out_dtype

    def run(x):
        a = norm_axis(axis, x.dim())
        xf = widen(x)
        if reverse:
            xf = torch.flip(xf, [a])
        y = torch.cumsum(xf, dim=a)
        if exclusive:
            y = y - xf
        if reverse:
            y = torch.flip(y, [a])
        return y.to(od)

    return Kernel(run, ["x"])


@register("one_hot")
def _one_hot(node: Node) -> Kernel:
    axis = node.int("axis", -1) if node.has("axis") else -1
    on = scalar(node.const("on_value")) if node.has("on_value") else 1
    off = scalar(node.const("off_value")) if node.has("off_value") else 0
    od = node.out_dtype

    def run(indices, size):
        n = int(scalar(size))
        idx = indices.to(torch.long)
        valid = (idx >= 0) & (idx < n)
        oh = F.one_hot(torch.where(valid, idx, 0), n) & valid.unsqueeze(-1)
        out = torch.where(oh.bool(), torch.tensor(on, dtype=od), torch.tensor(off, dtype=od))
        a = norm_axis(axis, idx.dim() + 1)
        return out.movedim(-1, a)

    return Kernel(run, ["indices", "one_hot_vector_size"])


@register("band_part")
def _band_part(node: Node) -> Kernel:
    lower = node.int("lower", -1) if node.has("lower") else -1
    upper = node.int("upper", -1) if node.has("upper") else -1

    def run(x):
        m, n = x.shape[-2], x.shape[-1]
        i = torch.arange(m).unsqueeze(1)
        j = torch.arange(n).unsqueeze(0)
        keep = ((lower < 0) | (i - j <= lower)) & ((upper < 0) | (j - i <= upper))
        return torch.where(keep, x, torch.zeros((), dtype=x.dtype))

    return Kernel(run, ["x"])


@register("topk")
def _topk(node: Node) -> Kernel:
    k = node.int("k", 1) if node.has("k") else 1
    axis = node.int("axis", -1) if node.has("axis") else -1
    ascending = node.bool("ascending", False) if node.has("ascending") else False
    sort = node.bool("sort", True) if node.has("sort") else True
    if node.has("return_indices") and not node.bool("return_indices"):
        raise Unsupported("return_indices=False")
    od = [node.torch_dtype(t.dtype) for t in node.out_types]

    def run(x):
        vals, idx = torch.topk(widen(x), k, dim=axis, largest=not ascending, sorted=sort)
        return vals.to(od[0]), idx.to(od[1])

    return Kernel(run, ["x"])


@register("argsort")
def _argsort(node: Node) -> Kernel:
    axis = node.int("axis", -1) if node.has("axis") else -1
    ascending = node.bool("ascending", False) if node.has("ascending") else False
    od = node.out_dtype
    return Kernel(lambda x: torch.argsort(widen(x), dim=axis, descending=not ascending, stable=True).to(od), ["x"])


@register("depth_to_space")
def _depth_to_space(node: Node) -> Kernel:
    bs = node.int("block_size")

    def run(x):  # TF/DCR order: channel index = (bh * bs + bw) * C_out + c
        n, c, h, w = x.shape
        y = x.reshape(n, bs, bs, c // (bs * bs), h, w).permute(0, 3, 4, 1, 5, 2)
        return y.reshape(n, c // (bs * bs), h * bs, w * bs)

    return Kernel(run, ["x"])


@register("space_to_depth")
def _space_to_depth(node: Node) -> Kernel:
    bs = node.int("block_size")

    def run(x):
        n, c, h, w = x.shape
        y = x.reshape(n, c, h // bs, bs, w // bs, bs).permute(0, 3, 5, 1, 2, 4)
        return y.reshape(n, c * bs * bs, h // bs, w // bs)

    return Kernel(run, ["x"])


@register("pixel_shuffle")
def _pixel_shuffle(node: Node) -> Kernel:
    f = node.int("upscale_factor")
    return Kernel(lambda x: F.pixel_shuffle(x, f), ["x"])


@register("pixel_unshuffle")
def _pixel_unshuffle(node: Node) -> Kernel:
    f = node.int("downscale_factor")
    return Kernel(lambda x: F.pixel_unshuffle(x, f), ["x"])


@register("sliding_windows")
def _sliding_windows(node: Node) -> Kernel:
    axis = node.int("axis")
    size = node.int("size")
    stride = node.int("stride", 1) if node.has("stride") else 1

    def run(x):
        a = norm_axis(axis, x.dim())
        y = x.unfold(a, size, stride)  # window dim appended last
        return y.movedim(-1, a + 1).contiguous()

    return Kernel(run, ["x"])


@register("crop")
def _crop(node: Node) -> Kernel:
    """Crop ``crop_height=[top, bottom]`` / ``crop_width=[left, right]`` off the last two dims
    (what the torch frontend emits for ConvTranspose2d's output_padding)."""
    ch = node.ints("crop_height")
    cw = node.ints("crop_width")

    def run(x):
        h, w = x.shape[-2], x.shape[-1]
        return x[..., ch[0] : h - ch[1], cw[0] : w - cw[1]]

    return Kernel(run, ["x"])
