"""Elementwise unary/binary/logical ops, select, clip, cast vs value_inference."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from coremltools.converters.mil.mil import Builder as mb

from miltest import assert_close, check_vs_value_inference, rng, run, value_inference

R = rng(1)
X32 = (R.standard_normal((2, 3, 5)) * 2).astype(np.float32)
POS32 = (np.abs(X32) + 0.1).astype(np.float32)
UNIT32 = np.clip(X32 / 5, -0.95, 0.95).astype(np.float32)

UNARY = {
    "abs": X32, "acos": UNIT32, "asin": UNIT32, "atan": X32, "atanh": UNIT32, "ceil": X32,
    "cos": X32, "cosh": X32, "erf": X32, "exp": X32, "exp2": X32, "floor": X32,
    "round": X32, "sign": X32, "sin": X32, "sinh": X32, "sqrt": POS32, "square": X32,
    "tan": UNIT32, "tanh": X32, "relu": X32, "relu6": X32 * 4, "sigmoid": X32,
    "softplus": X32, "softsign": X32,
}


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_unary(op, dtype):
    x = UNARY[op].astype(dtype)
    # fp16: computed in fp32 and rounded once -> within 1 ulp of numpy's fp16 ufuncs
    tol = dict(rtol=2e-3, atol=2e-3) if dtype == np.float16 else dict(rtol=2e-6, atol=1e-6)
    check_vs_value_inference(lambda x: getattr(mb, op)(x=x), {"x": x}, **tol)


@pytest.mark.parametrize("op,eps", [("inverse", 1e-4), ("log", 1e-45), ("rsqrt", 1e-12), ("inverse", 0.5), ("rsqrt", 2.0)])
def test_unary_with_epsilon(op, eps):
    x = POS32
    check_vs_value_inference(lambda x: getattr(mb, op)(x=x, epsilon=np.float32(eps)), {"x": x}, rtol=2e-6)
    if op == "inverse" and eps == 1e-4:  # the default epsilon is applied too
        (got,) = run(lambda x: mb.inverse(x=x), {"x": np.ones(3, np.float32)})
        assert_close(got, np.full(3, 1 / (1 + 1e-4)), rtol=1e-7)


def test_logical_not():
    check_vs_value_inference(lambda x: mb.logical_not(x=x), {"x": X32 > 0})


def test_round_half_to_even():
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.49], np.float32)
    (got,) = check_vs_value_inference(lambda x: mb.round(x=x), {"x": x})
    assert_close(got, [-2, -2, -0, 0, 2, 2, 4, 0])


def test_int_unary():
    x = np.array([[-3, 0, 4]], np.int32)
    for op in ("abs", "sign", "square"):
        (got,) = check_vs_value_inference(lambda x: getattr(mb, op)(x=x), {"x": x})
        assert got.dtype == np.int32


BINARY = ["add", "sub", "mul", "real_div", "floor_div", "mod", "pow", "maximum", "minimum",
          "equal", "not_equal", "greater", "greater_equal", "less", "less_equal"]


@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize("shapes", [((2, 3, 4), (2, 3, 4)), ((2, 1, 4), (3, 1)), ((4,), (2, 3, 4)), ((1,), (2, 3))])
def test_binary_fp32_broadcast(op, shapes):
    x = (R.standard_normal(shapes[0]) * 3).astype(np.float32)
    y = (R.standard_normal(shapes[1]) * 3).astype(np.float32)
    if op == "pow":
        x = np.abs(x) + 0.5
    if op in ("real_div", "floor_div", "mod"):
        y = np.where(np.abs(y) < 0.3, 1.7, y).astype(np.float32)
    rtol = 1e-5 if op in ("mod", "pow") else 1e-6
    check_vs_value_inference(lambda x, y: getattr(mb, op)(x=x, y=y), {"x": x, "y": y}, rtol=rtol, atol=1e-5)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "real_div", "floor_div", "mod", "maximum", "minimum", "greater", "equal"])
def test_binary_int32(op):
    x = np.array([[7, -7, 5, 0, -9, 12]], np.int32)
    y = np.array([[2, 2, -3, 4, -4, 5]], np.int32)
    got = run(lambda x, y: getattr(mb, op)(x=x, y=y), {"x": x, "y": y})[0]
    want = {
        "add": x + y, "sub": x - y, "mul": x * y, "real_div": np.trunc(x / y), "floor_div": x // y,
        "mod": np.mod(x, y), "maximum": np.maximum(x, y), "minimum": np.minimum(x, y),
        "greater": x > y, "equal": x == y,
    }[op]
    assert got.dtype == (np.bool_ if op in ("greater", "equal") else np.int32)
    assert_close(got, want)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "real_div", "maximum", "minimum", "floor_div", "mod", "pow"])
def test_binary_fp16_rounds_once(op):
    """fp16 results equal fp32 computation rounded once to fp16 (bit for bit)."""
    x = (R.standard_normal((64, 64)) * 8).astype(np.float16)
    y = (R.standard_normal((64, 64)) * 8).astype(np.float16)
    if op == "pow":
        x, y = np.abs(x) + np.float16(0.5), y / np.float16(4)
    if op in ("real_div", "floor_div", "mod"):
        y = np.where(np.abs(y) < 0.5, np.float16(1.5), y)
    (got,) = run(lambda x, y: getattr(mb, op)(x=x, y=y), {"x": x, "y": y})
    fns = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "real_div": torch.div, "maximum": torch.maximum,
           "minimum": torch.minimum, "floor_div": lambda a, b: torch.floor(a / b), "mod": torch.remainder,
           "pow": torch.pow}
    want = fns[op](torch.from_numpy(x).float(), torch.from_numpy(y).float()).half().numpy()
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want)


def test_fp16_overflow_to_inf():
    x = np.array([60000, -60000, 300, 1], np.float16)
    (got,) = run(lambda x: mb.mul(x=x, y=np.float16(2.0)), {"x": x})
    assert got.dtype == np.float16
    assert np.isposinf(got[0]) and np.isneginf(got[1]) and got[2] == 600
    (got,) = run(lambda x: mb.exp(x=x), {"x": np.array([11.0, 12.0], np.float16)})
    assert np.isfinite(got[0]) and np.isposinf(got[1])  # e^12 > 65504
    (got,) = run(lambda x: mb.add(x=x, y=x), {"x": np.array([40000.0], np.float16)})
    assert np.isposinf(got[0])
    # the same program in fp32 does not overflow
    (got,) = run(lambda x: mb.mul(x=x, y=np.float32(2.0)), {"x": x.astype(np.float32)})
    assert got[0] == 120000


def test_fp16_fp32_rounding_visible():
    x = np.array([1.0], np.float16)
    (got,) = run(lambda x: mb.add(x=x, y=np.float16(1e-4)), {"x": x})
    assert got[0] == 1.0  # 1 + 1e-4 rounds back to 1 in fp16
    (got,) = run(lambda x: mb.add(x=x, y=np.float32(1e-4)), {"x": x.astype(np.float32)})
    assert got[0] > 1.0


@pytest.mark.parametrize("op", ["logical_and", "logical_or", "logical_xor"])
def test_logical(op):
    x = R.random((3, 4)) > 0.5
    y = R.random((1, 4)) > 0.5
    check_vs_value_inference(lambda x, y: getattr(mb, op)(x=x, y=y), {"x": x, "y": y})


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_select_broadcast(dtype):
    cond = R.random((2, 1, 4)) > 0.5
    a = (R.standard_normal((3, 4)) * 10).astype(dtype)
    b = (R.standard_normal((2, 3, 1)) * 10).astype(dtype)
    check_vs_value_inference(lambda c, a, b: mb.select(cond=c, a=a, b=b), {"c": cond, "a": a, "b": b})
    # scalar branch (how converters write masked_fill); pymil infers select's shape from
    # a and b only, so keep cond no larger than b here
    c2 = R.random((2, 3, 4)) > 0.5
    b2 = (R.standard_normal((2, 3, 4)) * 10).astype(np.float16)
    (got,) = run(lambda c, b: mb.select(cond=c, a=np.array(-np.inf, np.float16), b=b), {"c": c2, "b": b2})
    assert got.dtype == np.float16 and np.isneginf(got[c2]).all() and (got[~c2] == b2[~c2]).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_clip_threshold(dtype):
    x = (X32 * 3).astype(dtype)
    check_vs_value_inference(lambda x: mb.clip(x=x, alpha=dtype(-1.5), beta=dtype(2.0)), {"x": x})
    check_vs_value_inference(lambda x: mb.clip(x=x, alpha=dtype(1.0), beta=dtype(np.inf)), {"x": x})
    check_vs_value_inference(lambda x: mb.threshold(x=x, alpha=dtype(0.5)), {"x": x})


@pytest.mark.parametrize(
    "src,dst",
    [(np.float32, "int32"), (np.float32, "fp16"), (np.float16, "fp32"), (np.int32, "fp16"), (np.int32, "bool"),
     (np.float32, "bool"), (np.bool_, "fp32"), (np.float16, "int32")],
)
def test_cast(src, dst):
    x = np.array([[-2.7, -0.5, 0.0, 0.49, 1.5, 3.99, 70000.0, 1e-8]])
    x = (x > 0) if src == np.bool_ else x.astype(src) if src != np.int32 else np.array([[-3, 0, 2, 7]], np.int32)
    if src == np.float16:
        x = np.array([[-2.7, -0.5, 0.0, 0.49, 1.5, 3.99, 100.5]], np.float16)
    got = run(lambda x: mb.cast(x=x, dtype=dst), {"x": x})[0]
    want = value_inference(lambda x: mb.cast(x=x, dtype=dst), {"x": x})[0]
    assert got.dtype == want.dtype
    assert_close(got, want)


def test_cast_fp32_to_fp16_overflow_and_truncation():
    x = np.array([70000.0, -70000.0, 1.00048828125, 2.7, -2.7], np.float32)
    (h,) = run(lambda x: mb.cast(x=x, dtype="fp16"), {"x": x})
    assert np.isposinf(h[0]) and np.isneginf(h[1]) and h[2] == np.float16(1.00048828125)
    (i,) = run(lambda x: mb.cast(x=x, dtype="int32"), {"x": x[2:]})
    np.testing.assert_array_equal(i, [1, 2, -2])  # toward zero


def test_cast_to_small_int_types():
    # int16/uint16 cannot be program outputs; converters use them for gather indices
    x = np.array([3, 70, 200], np.int32)
    (u,) = run(lambda x: mb.gather(x=np.arange(300, dtype=np.float32), indices=mb.cast(x=x, dtype="uint16")), {"x": x},
               opset=17)
    np.testing.assert_array_equal(u, [3, 70, 200])
    (s,) = run(lambda x: mb.gather(x=np.arange(300, dtype=np.float32), indices=mb.cast(x=x, dtype="int16")), {"x": x},
               opset=17)
    np.testing.assert_array_equal(s, [3, 70, 200])


ALL_FP16 = np.arange(65536, dtype=np.uint16).view(np.float16).reshape(256, 256)


@pytest.mark.parametrize(
    "op,ref",
    [("sin", torch.sin), ("cos", torch.cos), ("exp", torch.exp), ("tanh", torch.tanh), ("sigmoid", torch.sigmoid),
     ("sqrt", torch.sqrt), ("erf", torch.erf), ("atan", torch.atan), ("gelu", torch.nn.functional.gelu),
     ("square", torch.square), ("softplus", torch.nn.functional.softplus)],
)
def test_fp16_unary_exhaustive(op, ref):
    """Over every fp16 value: result == fp32 evaluation rounded once to fp16, up to 1 ulp
    for < 0.1% of inputs (two fp32 implementations of a function may round differently)."""
    (got,) = run(lambda x: getattr(mb, op)(x=x), {"x": ALL_FP16})
    want = ref(torch.from_numpy(ALL_FP16).float()).half().numpy()
    assert got.dtype == np.float16
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    assert (np.isnan(got) == np.isnan(want)).all()
    bad = ~same
    assert bad.sum() < 66, bad.sum()
    with np.errstate(invalid="ignore", over="ignore"):
        ulp = np.spacing(np.abs(want[bad]).astype(np.float16)).astype(np.float32)
    assert (np.abs(got[bad].astype(np.float32) - want[bad].astype(np.float32)) <= ulp).all()


def test_fp16_pow_const_exponent():
    x = ALL_FP16[np.isfinite(ALL_FP16)].reshape(-1)[:60000].reshape(240, 250)
    (got,) = run(lambda x: mb.pow(x=x, y=np.float16(2.0)), {"x": x})
    np.testing.assert_array_equal(got, (torch.from_numpy(x).float() ** 2).half().numpy())
    xp = np.abs(x) + np.float16(0.0)
    (got,) = run(lambda x: mb.pow(x=x, y=np.float16(0.5)), {"x": xp})
    np.testing.assert_allclose(got.astype(np.float32), np.sqrt(xp.astype(np.float32)), rtol=1e-3)
