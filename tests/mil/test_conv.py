"""conv / conv_transpose / pooling vs torch (conv ops have no value_inference)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from coremltools.converters.mil.mil import Builder as mb

from miltest import assert_close, rng, run

R = rng(7)


def _same_pads(n, k, s, d, lower=False):
    eff = (k - 1) * d + 1
    total = max(0, (math.ceil(n / s) - 1) * s + eff - n)
    small, big = total // 2, total - total // 2
    return (big, small) if lower else (small, big)


CONV_CASES = [
    # (spatial, C_in, C_out, kernel, stride, dilation, groups, pad_type, pad)
    ((17,), 4, 6, (3,), (1,), (1,), 1, "valid", None),
    ((17,), 4, 6, (3,), (1,), (1,), 1, "custom", (1, 1)),
    ((17,), 4, 6, (5,), (2,), (1,), 1, "custom", (3, 0)),
    ((17,), 4, 4, (3,), (1,), (3,), 1, "custom", (3, 3)),
    ((17,), 4, 4, (7,), (1,), (5,), 1, "custom", (15, 15)),
    ((17,), 4, 8, (3,), (1,), (1,), 4, "custom", (1, 1)),
    ((17,), 6, 6, (4,), (1,), (1,), 2, "same", None),
    ((17,), 6, 6, (4,), (3,), (2,), 1, "same", None),
    ((17,), 6, 6, (4,), (1,), (1,), 1, "same_lower", None),
    ((16,), 22, 8, (12,), (6,), (1,), 1, "custom", (3, 3)),
    ((9, 8), 3, 5, (3, 2), (2, 1), (1, 2), 1, "same", None),
    ((9, 8), 4, 4, (3, 3), (1, 1), (1, 1), 4, "custom", (1, 0, 2, 1)),
    ((5, 6, 4), 2, 3, (2, 3, 2), (1, 2, 1), (1, 1, 1), 1, "valid", None),
]


@pytest.mark.parametrize("case", range(len(CONV_CASES)))
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("with_bias", [True, False])
def test_conv(case, dtype, with_bias):
    sp, cin, cout, k, s, d, g, pad_type, pad = CONV_CASES[case]
    x = R.standard_normal((2, cin) + sp).astype(dtype)
    w = (R.standard_normal((cout, cin // g) + k) / np.sqrt(cin * np.prod(k))).astype(dtype)
    b = R.standard_normal(cout).astype(dtype)
    kw = dict(strides=list(s), dilations=list(d), groups=g, pad_type=pad_type)
    if pad is not None:
        kw["pad"] = list(pad)
    if with_bias:
        kw["bias"] = b
    (got,) = run(lambda x: mb.conv(x=x, weight=w, **kw), {"x": x}, opset=17 if pad_type == "same_lower" else 16)
    # reference: explicit padding + torch conv in float64
    nsp = len(sp)
    if pad_type == "valid":
        pads = [0] * 2 * nsp
    elif pad_type == "custom":
        pads = list(pad)
    else:
        pads = sum((list(_same_pads(sp[i], k[i], s[i], d[i], pad_type == "same_lower")) for i in range(nsp)), [])
    tp = sum(([pads[2 * i], pads[2 * i + 1]] for i in reversed(range(nsp))), [])
    xt = F.pad(torch.from_numpy(x).double(), tp)
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nsp]
    want = conv(xt, torch.from_numpy(w).double(), torch.from_numpy(b).double() if with_bias else None, s, 0, d, g).numpy()
    assert got.dtype == dtype
    tol = 3e-3 if dtype == np.float16 else 1e-5
    assert_close(got, want.astype(dtype), rtol=tol, atol=tol)


def test_conv_dynamic_weight():
    x = R.standard_normal((1, 3, 10)).astype(np.float32)
    w = R.standard_normal((4, 3, 3)).astype(np.float32)
    (got,) = run(lambda x, w: mb.conv(x=x, weight=w, pad_type="same"), {"x": x, "w": w})
    assert_close(got, F.conv1d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy(), rtol=1e-5, atol=1e-5)


CONVT_CASES = [
    # (L_in, C_in, C_out, k, stride, groups, pad_type, pad, output_shape_len, torch padding, torch output_padding)
    (8, 6, 4, 20, 10, 1, "custom", (5, 5), None, 5, 0),
    (8, 6, 4, 12, 6, 1, "custom", (3, 3), None, 3, 0),
    (8, 4, 4, 3, 2, 4, "custom", (1, 0), None, 1, 1),
    (8, 4, 4, 3, 2, 4, "custom", (0, 0), 17, 0, 0),  # output_shape == full length (what ct.convert emits)
    (8, 3, 2, 4, 2, 1, "valid", (0, 0), 19, 0, 1),  # output_shape past the full length: zero-extended + bias
    (8, 6, 4, 20, 10, 1, "custom", (5, 5), 80, 5, 0),
    (8, 3, 1, 20, 5, 1, "valid", (0, 0), 55, 0, 0),
    (8, 3, 2, 4, 2, 1, "valid", None, None, 0, 0),
]


@pytest.mark.parametrize("case", range(len(CONVT_CASES)))
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_conv_transpose(case, dtype):
    L, cin, cout, k, s, g, pad_type, pad, out_len, tpad, topad = CONVT_CASES[case]
    x = R.standard_normal((1, cin, L)).astype(dtype)
    w = (R.standard_normal((cin, cout // g, k)) / np.sqrt(k)).astype(dtype)
    b = R.standard_normal(cout).astype(dtype)
    kw = dict(strides=[s], groups=g, pad_type=pad_type, bias=b)
    if pad is not None:
        kw["pad"] = list(pad)
    want = F.conv_transpose1d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), torch.from_numpy(b).double(),
                              s, tpad, topad, g).numpy()
    if out_len is not None:
        kw["output_shape"] = [1, cout, out_len]
        want = want[..., :out_len]
    (got,) = run(lambda x: mb.conv_transpose(x=x, weight=w, **kw), {"x": x})
    tol = 3e-3 if dtype == np.float16 else 1e-5
    assert got.dtype == dtype
    assert_close(got, want.astype(dtype), rtol=tol, atol=tol)


def test_conv_transpose_same_and_2d():
    x = R.standard_normal((1, 3, 5, 4)).astype(np.float32)
    w = R.standard_normal((3, 2, 3, 3)).astype(np.float32)
    (got,) = run(lambda x: mb.conv_transpose(x=x, weight=w, strides=[2, 2], pad_type="same"), {"x": x})
    full = F.conv_transpose2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), stride=2).numpy()
    # full is (11, 9); "same" keeps in*stride = (10, 8), cropping (k - s) // 2 = 0 in front
    assert got.shape == (1, 2, 10, 8)
    assert_close(got, full[..., :10, :8], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["max_pool", "avg_pool", "l2_pool"])
@pytest.mark.parametrize("pad_type,exclude", [("valid", False), ("same", False), ("same", True), ("custom", True)])
def test_pool(kind, pad_type, exclude):
    x = R.standard_normal((1, 2, 9, 7)).astype(np.float32)
    kw = dict(kernel_sizes=[3, 2], strides=[2, 2], pad_type=pad_type)
    if pad_type == "custom":
        kw["pad"] = [1, 1, 0, 1]
    if kind == "avg_pool":
        kw["exclude_padding_from_average"] = exclude
    (got,) = run(lambda x: getattr(mb, kind)(x=x, **kw), {"x": x})
    if pad_type == "valid":
        pads = [0, 0, 0, 0]
    elif pad_type == "custom":
        pads = kw["pad"]
    else:
        pads = list(_same_pads(9, 3, 2, 1)) + list(_same_pads(7, 2, 2, 1))
    xt = torch.from_numpy(x).double()
    tp = [pads[2], pads[3], pads[0], pads[1]]
    if kind == "max_pool":
        want = F.max_pool2d(F.pad(xt, tp, value=-np.inf), [3, 2], [2, 2])
    elif kind == "l2_pool":
        want = torch.sqrt(F.avg_pool2d(F.pad(xt * xt, tp), [3, 2], [2, 2]) * 6)
    else:
        want = F.avg_pool2d(F.pad(xt, tp), [3, 2], [2, 2])
        if exclude:
            want = want / F.avg_pool2d(F.pad(torch.ones_like(xt), tp), [3, 2], [2, 2])
    assert_close(got, want.numpy(), rtol=1e-5, atol=1e-5)


def test_conv_transpose2d_output_padding_crop(tmp_path):
    """torch ConvTranspose2d(output_padding=1) converts to conv_transpose + crop."""
    import coremltools as ct

    from anetts.mil import load_program

    torch.manual_seed(0)
    m = torch.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1).eval()
    x = R.standard_normal((1, 3, 5, 4)).astype(np.float32)
    with torch.no_grad():
        want = m(torch.from_numpy(x)).numpy()
        traced = torch.jit.trace(m, torch.from_numpy(x))
    ml = ct.convert(traced, convert_to="mlprogram", inputs=[ct.TensorType(name="x", shape=x.shape)],
                    compute_precision=ct.precision.FLOAT32, minimum_deployment_target=ct.target.macOS13)
    ml.save(str(tmp_path / "ct2d.mlpackage"))
    prog = load_program(tmp_path / "ct2d.mlpackage")
    assert "crop" in prog.op_types()
    (got,) = prog.run({"x": x}).values()
    assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel,spatial,bias", [((1,), (5,), True), ((3,), (7,), False), ((1, 1), (2, 3), True)])
def test_conv_with_weights_kept_fp16(kernel, spatial, bias):
    """A program too large to widen its weights at load widens each conv weight at each call, a 1x1
    one (how Linear layers are laid out for the ANE) a block of output channels at a time: the same
    outputs as the widened program, to the bit (2,000 channels are several blocks)."""
    cin, cout = 512, 2000
    x = R.standard_normal((1, cin, *spatial)).astype(np.float16)
    w = (R.standard_normal((cout, cin, *kernel)) * 0.05).astype(np.float16)
    b = R.standard_normal(cout).astype(np.float16) if bias else None
    op = lambda x: mb.conv(x=x, weight=w, bias=b, pad_type="same")  # noqa: E731
    (widened,) = run(op, {"x": x})
    (kept,) = run(op, {"x": x}, widen_weights=False)
    assert kept.dtype == widened.dtype == np.float16
    np.testing.assert_array_equal(kept, widened)
