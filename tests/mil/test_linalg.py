"""linear, matmul, einsum, scaled_dot_product_attention."""
from __future__ import annotations

import numpy as np
import pytest
from coremltools.converters.mil.mil import Builder as mb

from miltest import assert_close, check_vs_value_inference, rng, run

R = rng(6)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_linear(dtype):
    x = R.standard_normal((2, 3, 8)).astype(dtype)
    w = R.standard_normal((5, 8)).astype(dtype)
    b = R.standard_normal(5).astype(dtype)
    (got,) = run(lambda x: mb.linear(x=x, weight=w, bias=b), {"x": x})
    want = (x.astype(np.float64) @ w.T.astype(np.float64) + b).astype(dtype)
    tol = 2e-3 if dtype == np.float16 else 1e-5
    assert got.dtype == dtype
    assert_close(got, want, rtol=tol, atol=tol)
    check_vs_value_inference(lambda x: mb.linear(x=x, weight=w), {"x": x}, rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("shape", [(1, 2048), (16, 2048), (2, 3, 2048)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_with_weights_kept_fp16(shape, bias):
    """A program too large to widen its weights at load widens each `linear` weight a block of rows at
    a time: the same outputs as the widened program, to the bit (300 rows: two full blocks and a part)."""
    x = R.standard_normal(shape).astype(np.float16)
    w = (R.standard_normal((300, 2048)) * 0.05).astype(np.float16)
    b = R.standard_normal(300).astype(np.float16) if bias else None
    op = lambda x: mb.linear(x=x, weight=w, bias=b)  # noqa: E731
    (widened,) = run(op, {"x": x})
    (kept,) = run(op, {"x": x}, widen_weights=False)
    assert kept.dtype == widened.dtype == np.float16
    np.testing.assert_array_equal(kept, widened)


@pytest.mark.parametrize(
    "xs,ys,tx,ty",
    [((3, 4), (4, 5), False, False), ((2, 3, 4), (5, 4), False, True), ((4, 3), (2, 4, 5), True, False),
     ((4,), (4, 5), False, False), ((2, 1, 3, 4), (3, 4, 2), False, False)],
)
def test_matmul(xs, ys, tx, ty):
    x = R.standard_normal(xs).astype(np.float32)
    y = R.standard_normal(ys).astype(np.float32)
    check_vs_value_inference(lambda x, y: mb.matmul(x=x, y=y, transpose_x=tx, transpose_y=ty), {"x": x, "y": y},
                             rtol=1e-5, atol=1e-5)


def test_matmul_fp16_accumulates_in_fp32():
    x = np.full((1, 4096), 1.0, np.float16)
    y = np.full((4096, 1), 1.0, np.float16)
    (got,) = run(lambda x, y: mb.matmul(x=x, y=y), {"x": x, "y": y})
    assert got.dtype == np.float16 and got[0, 0] == 4096


def test_einsum():
    a = R.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = R.standard_normal((2, 5, 4, 6)).astype(np.float32)
    check_vs_value_inference(lambda a, b: mb.einsum(values=(a, b), equation="nchw,nwhu->nchu"), {"a": a, "b": b},
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask", [None, "bool", "float"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_sdpa(mask, dtype):
    q = R.standard_normal((1, 2, 5, 8)).astype(dtype)
    k = R.standard_normal((1, 2, 7, 8)).astype(dtype)
    v = R.standard_normal((1, 2, 7, 4)).astype(dtype)
    inputs = {"q": q, "k": k, "v": v}
    if mask == "bool":
        m = R.random((1, 1, 5, 7)) > 0.3
        m[..., 0] = True
        inputs["m"] = m
    elif mask == "float":
        inputs["m"] = (R.standard_normal((5, 7)) * 2).astype(dtype)

    def build(q, k, v, m=None):
        return mb.scaled_dot_product_attention(query=q, key=k, value=v, **({} if m is None else {"attn_mask": m}))

    tol = 3e-3 if dtype == np.float16 else 1e-5
    if dtype == np.float16:  # reference: fp32 value_inference rounded once
        from miltest import value_inference

        (got,) = run(build, inputs, opset=18)
        (want,) = value_inference(build, {n: a.astype(np.float32) if a.dtype == np.float16 else a
                                          for n, a in inputs.items()}, opset=18)
        assert got.dtype == np.float16
        assert_close(got, want.astype(np.float16), rtol=tol, atol=tol)
    else:
        check_vs_value_inference(build, inputs, opset=18, rtol=tol, atol=tol)
