"""gather / scatter family: axes, negative indices per opset, validate_indices, modes."""
from __future__ import annotations

import numpy as np
import pytest
from coremltools.converters.mil.mil import Builder as mb

from anetts.mil import MilRuntimeError
from miltest import assert_close, check_vs_value_inference, rng, run

R = rng(4)
X = R.standard_normal((3, 4, 5)).astype(np.float32)


@pytest.mark.parametrize("axis", [0, 1, -1, -2])
@pytest.mark.parametrize("idx_shape", [(2,), (2, 3)])
def test_gather_axes(axis, idx_shape):
    n = X.shape[axis]
    idx = R.integers(0, n, idx_shape).astype(np.int32)
    check_vs_value_inference(lambda x, i: mb.gather(x=x, indices=i, axis=axis), {"x": X, "i": idx})


def test_gather_negative_indices_ios16_wrap():
    idx = np.array([-1, 0, -4, 3], np.int32)
    check_vs_value_inference(lambda x, i: mb.gather(x=x, indices=i, axis=1), {"x": X, "i": idx}, opset=16)


def test_gather_batch_dims():
    x = R.standard_normal((2, 3, 4)).astype(np.float32)
    idx = R.integers(0, 3, (2, 5)).astype(np.int32)
    check_vs_value_inference(lambda x, i: mb.gather(x=x, indices=i, axis=1, batch_dims=1), {"x": x, "i": idx})


@pytest.mark.parametrize("validate", [True, False])
def test_gather_ios17_negative_and_oob_indices_raise(validate):
    idx = np.array([0, -1], np.int32)
    with pytest.raises(MilRuntimeError, match="out of bounds"):
        run(lambda x, i: mb.gather(x=x, indices=i, axis=1, validate_indices=validate), {"x": X, "i": idx}, opset=17)
    with pytest.raises(MilRuntimeError, match="out of bounds"):
        run(lambda x, i: mb.gather(x=x, indices=i, axis=1), {"x": X, "i": np.array([4], np.int32)}, opset=16)
    (got,) = run(lambda x, i: mb.gather(x=x, indices=i, axis=-1, validate_indices=validate),
                 {"x": X, "i": np.array([4, 0], np.int32)}, opset=17)
    assert_close(got, X[..., [4, 0]])


def test_gather_embedding_fp16_const_table():
    table = R.standard_normal((10, 6)).astype(np.float16)
    ids = np.array([[1, 9, 0]], np.int32)
    (got,) = run(lambda i: mb.gather(x=table, indices=i, axis=0), {"i": ids})
    assert got.dtype == np.float16
    assert_close(got, table[ids])


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("opset", [16, 17])
def test_gather_along_axis(axis, opset):
    shape = list(X.shape)
    shape[axis] = 7
    idx = R.integers(0, X.shape[axis], shape).astype(np.int32)
    check_vs_value_inference(lambda x, i: mb.gather_along_axis(x=x, indices=i, axis=axis), {"x": X, "i": idx},
                             opset=opset)


def test_gather_along_axis_negative_index_ios16():
    idx = -R.integers(1, 4, (3, 4, 2)).astype(np.int32)
    check_vs_value_inference(lambda x, i: mb.gather_along_axis(x=x, indices=i, axis=2), {"x": X, "i": idx})


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_gather_nd(depth):
    idx = np.stack([R.integers(0, X.shape[d], (4, 2)) for d in range(depth)], -1).astype(np.int32)
    (got,) = run(lambda x, i: mb.gather_nd(x=x, indices=i), {"x": X, "i": idx})  # no value_inference
    assert_close(got, X[tuple(np.moveaxis(idx, -1, 0))])


def test_gather_nd_batch_dims():
    idx = R.integers(0, 4, (3, 2, 1)).astype(np.int32)
    (got,) = run(lambda x, i: mb.gather_nd(x=x, indices=i, batch_dims=1), {"x": X, "i": idx})
    want = np.stack([X[b][idx[b, :, 0]] for b in range(3)])
    assert_close(got, want)


MODES = ["update", "add", "sub", "mul", "div", "max", "min"]


def _combine(mode, a, b):
    return {"update": b, "add": a + b, "sub": a - b, "mul": a * b, "div": a / b, "max": np.maximum(a, b),
            "min": np.minimum(a, b)}[mode]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("axis", [0, -1])
def test_scatter(mode, axis):
    n = X.shape[axis]
    idx = np.array([n - 1, 0], np.int32)
    ushape = list(X.shape)
    ushape[axis] = 2
    upd = (R.standard_normal(ushape) + 3).astype(np.float32)
    (got,) = run(lambda d, i, u: mb.scatter(data=d, indices=i, updates=u, axis=axis, mode=mode), {"d": X, "i": idx, "u": upd})
    want = X.copy()
    sl = [slice(None)] * 3
    for k, j in enumerate(idx):
        sl[axis] = j
        su = [slice(None)] * 3
        su[axis] = k
        want[tuple(sl)] = _combine(mode, want[tuple(sl)], upd[tuple(su)])
    assert_close(got, want, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_scatter_along_axis(mode):
    idx = np.stack([R.permutation(5)[:2] for _ in range(12)]).reshape(3, 4, 2).astype(np.int32)
    upd = (R.standard_normal((3, 4, 2)) + 3).astype(np.float32)
    (got,) = run(lambda d, i, u: mb.scatter_along_axis(data=d, indices=i, updates=u, axis=2, mode=mode),
                 {"d": X, "i": idx, "u": upd})
    want = X.copy()
    for a in range(3):
        for b in range(4):
            for k in range(2):
                j = idx[a, b, k]
                want[a, b, j] = _combine(mode, want[a, b, j], upd[a, b, k])
    assert_close(got, want, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_scatter_nd(mode):
    idx = np.array([[0, 1], [2, 3], [1, 0]], np.int32)
    upd = (R.standard_normal((3, 5)) + 3).astype(np.float32)
    (got,) = run(lambda d, i, u: mb.scatter_nd(data=d, indices=i, updates=u, mode=mode), {"d": X, "i": idx, "u": upd})
    want = X.copy()
    for k, (a, b) in enumerate(idx):
        want[a, b] = _combine(mode, want[a, b], upd[k])
    assert_close(got, want, rtol=1e-6)


def test_scatter_nd_dynamic_nonzero_update():
    """The pattern torch's ``t[mask] = v`` converts to: non_zero + tile + scatter_nd."""
    data = R.standard_normal((2, 3)).astype(np.float16)

    def build(d):
        mask = mb.less(x=d, y=np.float16(0.0))
        nz = mb.non_zero(x=mb.cast(x=mask, dtype="int32"))
        n = mb.slice_by_index(x=mb.shape(x=nz), begin=[0], end=[1])
        vals = mb.tile(x=np.array([3.14], np.float16), reps=n)
        return mb.scatter_nd(data=d, indices=nz, updates=vals, mode="update")

    (got,) = run(build, {"d": data})
    assert_close(got, np.where(data < 0, np.float16(3.14), data))


@pytest.mark.parametrize("op", ["gather", "gather_along_axis"])
def test_gather_from_a_uint16_tensor(op):
    """coremltools narrows an index tensor it gathers from (argsort's output, in the fused fast AR's
    sampler) to uint16, which torch's CPU gather kernels do not take."""
    order = np.argsort(-X[0], axis=-1).astype(np.int32)  # (4, 5)
    idx = np.array([[0], [2], [4], [1]], np.int32)

    def build(o, i):
        o16 = mb.cast(x=o, dtype="uint16")
        picked = mb.gather_along_axis(x=o16, indices=i, axis=1) if op == "gather_along_axis" else \
            mb.gather(x=o16, indices=mb.reshape(x=i, shape=[4]), axis=1)
        return mb.cast(x=picked, dtype="int32")

    (got,) = run(build, {"o": order, "i": idx}, opset=17)
    want = np.take_along_axis(order, idx, 1) if op == "gather_along_axis" else order[:, idx.reshape(-1)]
    assert np.array_equal(got, want)
