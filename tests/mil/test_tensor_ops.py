"""Shape/layout ops vs value_inference (or numpy where there is none)."""
from __future__ import annotations

import numpy as np
import pytest
from coremltools.converters.mil.mil import Builder as mb

from miltest import assert_close, check_vs_value_inference, rng, run

R = rng(3)
X = R.standard_normal((2, 3, 4, 5)).astype(np.float32)


@pytest.mark.parametrize(
    "shape,opset",
    [([6, 20], 16), ([-1, 5], 16), ([0, 0, -1, 5], 16), ([2, -1], 16), ([1, 0, -1, 0], 17), ([0, 0, -1], 17),
     ([1, 1, 0, -1, 0], 17), ([120], 18)],
)
def test_reshape_special_values(shape, opset):
    (got,) = run(lambda x: mb.reshape(x=x, shape=np.array(shape, np.int32)), {"x": X}, opset=opset)
    # iOS17: shape[i] == 0 copies x.shape[j] with len(shape) - i == rank - j (1 if out of range)
    if shape == [1, 0, -1, 0]:
        want_shape = (1, 3, 8, 5)
    elif shape == [0, 0, -1]:
        want_shape = (3, 4, 10)
    elif shape == [1, 1, 0, -1, 0]:
        want_shape = (1, 1, 3, 8, 5)
    else:
        want_shape = X.reshape([X.shape[i] if s == 0 else s for i, s in enumerate(shape)]).shape
    assert_close(got, X.reshape(want_shape))


def test_reshape_dynamic_shape():
    (got,) = run(lambda x: mb.reshape(x=x, shape=mb.concat(values=[mb.shape(x=x), [1]], axis=0)), {"x": X})
    assert got.shape == X.shape + (1,)


@pytest.mark.parametrize("perm", [[0, 1, 2, 3], [3, 2, 1, 0], [0, 2, 3, 1], [-1, 0, 1, 2]])
def test_transpose(perm):
    check_vs_value_inference(lambda x: mb.transpose(x=x, perm=perm), {"x": X})


@pytest.mark.parametrize("axes", [[0], [-1], [1, 3], [-1, -3], [0, 5]])
def test_expand_dims(axes):
    check_vs_value_inference(lambda x: mb.expand_dims(x=x, axes=axes), {"x": X})


@pytest.mark.parametrize("axes", [None, [2], [-1], [0, -3]])
def test_squeeze(axes):
    x = R.standard_normal((1, 3, 1, 4, 1)).astype(np.float32)
    kw = {} if axes is None else {"axes": axes}
    check_vs_value_inference(lambda x: mb.squeeze(x=x, **kw), {"x": x})


@pytest.mark.parametrize("axis", [0, -1, 1])
def test_concat(axis):
    a = R.standard_normal((2, 3, 4)).astype(np.float32)
    b = R.standard_normal((2, 3, 4)).astype(np.float32)
    check_vs_value_inference(lambda a, b: mb.concat(values=[a, b, a], axis=axis), {"a": a, "b": b})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_interleave(axis):
    """concat's value_inference ignores ``interleave``; reference from the op doc:
    output[0::n] = values[0], output[1::n] = values[1], ... along ``axis``."""
    a = R.standard_normal((2, 3, 4)).astype(np.float32)
    b = R.standard_normal((2, 3, 4)).astype(np.float32)
    (got,) = run(lambda a, b: mb.concat(values=[a, b, a], axis=axis, interleave=True), {"a": a, "b": b})
    ax = axis % 3
    want = np.stack([a, b, a], axis=ax + 1).reshape([d * 3 if i == ax else d for i, d in enumerate(a.shape)])
    idx = [slice(None)] * 3
    idx[ax] = slice(1, None, 3)
    assert_close(want[tuple(idx)], b)
    assert_close(got, want)


def test_concat_fp16_and_int():
    a = R.standard_normal((2, 3)).astype(np.float16)
    check_vs_value_inference(lambda a: mb.concat(values=[a, a], axis=1), {"a": a})
    i = np.arange(6, dtype=np.int32).reshape(2, 3)
    check_vs_value_inference(lambda i: mb.concat(values=[i, i], axis=0), {"i": i})


@pytest.mark.parametrize("kw", [dict(num_splits=2, axis=3 - 4), dict(split_sizes=[1, 3], axis=2), dict(num_splits=3, axis=1)])
def test_split(kw):
    x = R.standard_normal((2, 3, 4, 6)).astype(np.float32)
    check_vs_value_inference(lambda x: mb.split(x=x, **kw), {"x": x})


@pytest.mark.parametrize("axis", [0, 2, -1])
def test_stack(axis):
    a = R.standard_normal((3, 4)).astype(np.float32)
    check_vs_value_inference(lambda a: mb.stack(values=[a, mb.mul(x=a, y=2.0)], axis=axis), {"a": a})


SLICES = [
    dict(begin=[0, 1, 0, 0], end=[2, 3, 4, 5]),
    dict(begin=[0, 0, 1, 0], end=[2, 3, 4, 5], stride=[1, 2, 2, 3]),
    dict(begin=[1, -1, -2, 4], end=[0, 0, 0, 0], stride=[-1, -1, -1, -2]),
    dict(begin=[0, 0, 0, 0], end=[1, 2, 3, 4], begin_mask=[True, True, False, True], end_mask=[False, True, True, False]),
    dict(begin=[1, 0, 2, 0], end=[2, 3, 3, 5], squeeze_mask=[True, False, True, False]),
    dict(begin=[0, 0, -3, 0], end=[2, 3, -1, 5]),
    dict(begin=[0, 0, 0, 0], end=[2, 30, 4, 5]),
]


@pytest.mark.parametrize("case", range(len(SLICES)))
def test_slice_by_index(case):
    kw = {k: np.array(v, np.int32 if k in ("begin", "end", "stride") else bool) for k, v in SLICES[case].items()}
    check_vs_value_inference(lambda x: mb.slice_by_index(x=x, **kw), {"x": X})


def test_slice_by_index_dynamic_begin():
    x = np.arange(10, dtype=np.float32)
    b = np.array([3], np.int32)
    (got,) = run(lambda x, b: mb.slice_by_index(x=x, begin=b, end=np.array([8], np.int32)), {"x": x, "b": b})
    assert_close(got, x[3:8])


@pytest.mark.parametrize("begin,size", [([0, 1, 0, 2], [2, 2, -1, 3]), ([1, -2, 1, 0], [1, 2, 3, -1])])
def test_slice_by_size(begin, size):
    check_vs_value_inference(
        lambda x: mb.slice_by_size(x=x, begin=np.array(begin, np.int32), size=np.array(size, np.int32)), {"x": X}
    )


@pytest.mark.parametrize("reps", [[1, 1, 1, 1], [2, 1, 3, 1], [1, 2, 1, 2]])
def test_tile(reps):
    check_vs_value_inference(lambda x: mb.tile(x=x, reps=reps), {"x": X})


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate"])
@pytest.mark.parametrize("pad", [[1, 2], [0, 3, 2, 0], [1, 1, 2, 2, 0, 1], [1, 0]])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_pad(mode, pad, dtype):
    x = X[0].astype(dtype)
    kw = dict(constant_val=dtype(2.5)) if mode == "constant" else {}
    check_vs_value_inference(lambda x: mb.pad(x=x, pad=np.array(pad, np.int32), mode=mode, **kw), {"x": x})


def test_pad_rank5_reflect():
    x = R.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
    check_vs_value_inference(lambda x: mb.pad(x=x, pad=np.array([1, 1, 2, 2, 3, 1], np.int32), mode="reflect"), {"x": x})


def test_range_fill_shape():
    s = np.array([2.0], np.float32)
    (r,) = run(lambda s: mb.range_1d(start=mb.squeeze(x=s), end=np.float32(7.5), step=np.float32(1.5)), {"s": s})
    assert_close(r, np.arange(2.0, 7.5, 1.5, dtype=np.float32))
    n = np.array([7], np.int32)
    (r,) = run(lambda n: mb.range_1d(start=np.int32(10), end=mb.squeeze(x=n), step=np.int32(-2)), {"n": n})
    assert_close(r, np.arange(10, 7, -2, dtype=np.int32))
    (f, sh) = run(lambda x: (mb.fill(shape=mb.shape(x=x), value=np.float32(3.0)), mb.shape(x=x)), {"x": X})
    assert_close(f, np.full(X.shape, 3.0, np.float32))
    assert_close(sh, np.array(X.shape, np.int32))


def test_non_zero():
    x = (R.random((3, 4)) > 0.5).astype(np.float32)
    (got,) = run(lambda x: mb.non_zero(x=x), {"x": x})
    assert got.dtype == np.int32
    assert_close(got, np.transpose(np.nonzero(x)))


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("axis", [0, -1])
def test_cumsum(exclusive, reverse, axis):
    build = lambda x: mb.cumsum(x=x, axis=axis, exclusive=exclusive, reverse=reverse)  # noqa: E731
    if not reverse and not exclusive:
        check_vs_value_inference(build, {"x": X}, rtol=1e-5, atol=1e-5)
        return
    # value_inference crashes for exclusive=True in coremltools 9.0; numpy reference
    (got,) = run(build, {"x": X})
    xr = np.flip(X, axis) if reverse else X
    want = np.cumsum(xr, axis) - (xr if exclusive else 0)
    assert_close(got, np.flip(want, axis) if reverse else want, rtol=1e-5, atol=1e-5)


def test_cumsum_fp16_accumulates_in_fp32():
    x = np.full((1, 4096), 1.0, np.float16)
    (got,) = run(lambda x: mb.cumsum(x=x, axis=1), {"x": x})
    # fp16 accumulation would stall at 2048; fp32 accumulation rounds each result once
    assert got.dtype == np.float16 and got[0, -1] == 4096 and got[0, 2048] == np.float16(2049)


def test_one_hot_band_part_reverse():
    idx = np.array([[0, 3], [2, 1]], np.int32)
    (got,) = run(lambda i: mb.one_hot(indices=i, one_hot_vector_size=4, axis=1,
                                     on_value=np.float32(2.0), off_value=np.float32(-1.0)), {"i": idx})
    want = np.where(np.arange(4)[None, :, None] == idx[:, None, :], 2.0, -1.0)
    assert_close(got, want)
    m = R.standard_normal((2, 5, 5)).astype(np.float32)
    for lo, hi in [(0, -1), (-1, 0), (1, 2), (0, 0)]:
        (got,) = run(lambda m: mb.band_part(x=m, lower=lo, upper=hi), {"m": m})
        i, j = np.arange(5)[:, None], np.arange(5)[None]
        keep = ((lo < 0) | (i - j <= lo)) & ((hi < 0) | (j - i <= hi))
        assert_close(got, m * keep)
    check_vs_value_inference(lambda x: mb.reverse(x=x, axes=[0, -1]), {"x": X})
    check_vs_value_inference(lambda x: mb.reverse(x=x), {"x": X})


def test_reverse_sequence():
    x = R.standard_normal((3, 5, 2)).astype(np.float32)
    lengths = np.array([2, 5, 0], np.int32)
    (got,) = run(lambda x, l: mb.reverse_sequence(x=x, lengths=l, seq_axis=1, batch_axis=0), {"x": x, "l": lengths})
    want = x.copy()
    for b, n in enumerate(lengths):
        want[b, :n] = x[b, :n][::-1]
    assert_close(got, want)


@pytest.mark.parametrize("ascending", [False, True])
def test_topk_argsort(ascending):
    x = R.permutation(60).astype(np.float32).reshape(3, 4, 5)
    check_vs_value_inference(lambda x: mb.topk(x=x, k=2, axis=1, ascending=ascending), {"x": x})
    check_vs_value_inference(lambda x: mb.argsort(x=x, axis=-1, ascending=ascending), {"x": x})


def test_flatten2d_and_layout_ops():
    check_vs_value_inference(lambda x: mb.flatten2d(x=x, axis=2), {"x": X})
    check_vs_value_inference(lambda x: mb.flatten2d(x=x, axis=-1), {"x": X})
    x = R.standard_normal((1, 8, 2, 3)).astype(np.float32)
    (d2s,) = run(lambda x: mb.depth_to_space(x=x, block_size=2), {"x": x})
    import torch
    import torch.nn.functional as F

    # TF depth_to_space (DCR): channel = (bh * bs + bw) * C_out + c
    want = x.reshape(1, 2, 2, 2, 2, 3).transpose(0, 3, 4, 1, 5, 2).reshape(1, 2, 4, 6)
    assert_close(d2s, want)
    (s2d,) = run(lambda x: mb.space_to_depth(x=x, block_size=2), {"x": want})
    assert_close(s2d, x)
    (ps,) = run(lambda x: mb.pixel_shuffle(x=x, upscale_factor=2), {"x": x})
    assert_close(ps, F.pixel_shuffle(torch.from_numpy(x), 2).numpy())
    y = R.standard_normal((2, 7, 3)).astype(np.float32)
    (got,) = run(lambda y: mb.sliding_windows(x=y, axis=1, size=3, stride=2), {"y": y})
    assert_close(got, np.stack([y[:, i:i + 3] for i in range(0, 5, 2)], axis=1))


def test_slice_update():
    x = np.zeros((3, 6), np.float32)
    u = np.ones((3, 2), np.float32)
    (got,) = run(lambda x, u: mb.slice_update(x=x, update=u, begin=np.array([0, 1], np.int32),
                                              end=np.array([3, 6], np.int32), stride=np.array([1, 3], np.int32)),
                 {"x": x, "u": u}, opset=18)
    want = x.copy()
    want[:, 1:6:3] = 1
    assert_close(got, want)


def test_identity_fill_like_reshape_like_pixel_unshuffle():
    check_vs_value_inference(lambda x: mb.identity(x=x), {"x": X})
    (got,) = run(lambda x: mb.fill_like(ref_tensor=x, value=np.float32(1.5)), {"x": X}, opset=16)
    assert_close(got, np.full(X.shape, 1.5, np.float32))
    y = R.standard_normal((6, 20)).astype(np.float32)
    (got,) = run(lambda x, y: mb.reshape_like(x=y, ref_tensors=(x,), begins=(1,), ends=(3,), end_masks=(False,)),
                 {"x": R.standard_normal((2, 12, 10, 3)).astype(np.float32), "y": y}, opset=16)
    assert_close(got, y.reshape(12, 10))
    import torch
    import torch.nn.functional as F

    z = R.standard_normal((1, 2, 4, 6)).astype(np.float32)
    (got,) = run(lambda z: mb.pixel_unshuffle(x=z, downscale_factor=np.uint32(2)), {"z": z}, opset=16)
    assert_close(got, F.pixel_unshuffle(torch.from_numpy(z), 2).numpy())
