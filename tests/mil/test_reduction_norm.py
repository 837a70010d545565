"""Reductions and normalizations."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from coremltools.converters.mil.mil import Builder as mb

from miltest import assert_close, check_vs_value_inference, rng, run

R = rng(5)
X = R.standard_normal((2, 3, 4, 5)).astype(np.float32)
REDUCE = ["reduce_sum", "reduce_mean", "reduce_prod", "reduce_max", "reduce_min", "reduce_l1_norm", "reduce_l2_norm",
          "reduce_sum_square", "reduce_log_sum", "reduce_log_sum_exp"]


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("axes,keep", [(None, False), ([1], True), ([-1, 0], False), ([2, -3], True)])
def test_reduce(op, axes, keep):
    x = np.abs(X) + 0.5 if op == "reduce_log_sum" else X
    kw = {} if axes is None else {"axes": axes}
    check_vs_value_inference(lambda x: getattr(mb, op)(x=x, keep_dims=keep, **kw), {"x": x}, rtol=1e-5, atol=1e-5)


def test_reduce_int32_and_fp16_accumulation():
    i = R.integers(-50, 50, (3, 7)).astype(np.int32)
    (got,) = check_vs_value_inference(lambda x: mb.reduce_sum(x=x, axes=[1]), {"x": i})
    assert got.dtype == np.int32
    h = np.full((1, 5000), 1.0, np.float16)
    (got,) = run(lambda x: mb.reduce_sum(x=x, axes=[1]), {"x": h})
    assert got.dtype == np.float16 and got[0] == 5000  # fp32 accumulator, one rounding
    (got,) = run(lambda x: mb.reduce_sum(x=x, axes=[1]), {"x": np.full((1, 70), 1000.0, np.float16)})
    assert np.isposinf(got[0])  # 70000 overflows fp16 when rounded


@pytest.mark.parametrize("op", ["reduce_argmax", "reduce_argmin"])
@pytest.mark.parametrize("axis,keep", [(0, False), (-1, True), (2, False)])
def test_argmax(op, axis, keep):
    x = np.round(X * 2) / 2  # ties: first occurrence wins
    (got,) = check_vs_value_inference(lambda x: getattr(mb, op)(x=x, axis=axis, keep_dims=keep), {"x": x})
    assert got.dtype == np.int32


@pytest.mark.parametrize("axes", [[-1], [2, 3], [1, 3], [0, 1, 2, 3]])
@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm(axes, affine):
    shape = [X.shape[a] for a in axes]
    kw = dict(gamma=R.standard_normal(shape).astype(np.float32), beta=R.standard_normal(shape).astype(np.float32)) if affine else {}
    check_vs_value_inference(lambda x: mb.layer_norm(x=x, axes=axes, epsilon=np.float32(1e-5), **kw), {"x": X},
                             rtol=1e-5, atol=1e-5)


def test_layer_norm_fp16():
    x = (X * 30).astype(np.float16)
    (got,) = run(lambda x: mb.layer_norm(x=x, axes=[-1], epsilon=np.float16(1e-5)), {"x": x})
    want = F.layer_norm(torch.from_numpy(x).float(), (5,), eps=1e-5).half().numpy()
    assert got.dtype == np.float16
    assert_close(got, want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_instance_norm(rank, dtype):
    x = (X if rank == 4 else X[0]).astype(dtype)
    c = x.shape[1]
    g, b = R.standard_normal(c).astype(dtype), R.standard_normal(c).astype(dtype)
    (got,) = run(lambda x: mb.instance_norm(x=x, gamma=g, beta=b, epsilon=dtype(1e-5)), {"x": x})
    want = F.instance_norm(torch.from_numpy(x).float(), weight=torch.from_numpy(g).float(),
                           bias=torch.from_numpy(b).float(), eps=1e-5).numpy()
    tol = 2e-3 if dtype == np.float16 else 1e-5
    assert got.dtype == dtype
    assert_close(got, want.astype(dtype), rtol=tol, atol=tol)


def test_batch_norm_and_l2_norm():
    c = X.shape[1]
    mean, var = R.standard_normal(c).astype(np.float32), (R.random(c) + 0.5).astype(np.float32)
    g, b = R.standard_normal(c).astype(np.float32), R.standard_normal(c).astype(np.float32)
    (got,) = run(lambda x: mb.batch_norm(x=x, mean=mean, variance=var, gamma=g, beta=b, epsilon=np.float32(1e-3)), {"x": X})
    want = (X - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-3) * g[:, None, None] + b[:, None, None]
    assert_close(got, want, rtol=1e-5, atol=1e-5)
    check_vs_value_inference(lambda x: mb.l2_norm(x=x, epsilon=np.float32(1e-6)), {"x": X}, rtol=1e-5)
    check_vs_value_inference(lambda x: mb.l2_norm(x=x), {"x": X[0]}, rtol=1e-5)
