"""upsample / resize ops vs torch and the op docs' grid examples."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from coremltools.converters.mil.mil import Builder as mb

from miltest import assert_close, rng, run

R = rng(8)
X = R.standard_normal((1, 3, 4, 6)).astype(np.float32)


@pytest.mark.parametrize("sh,sw", [(2, 1), (1, 300), (2, 3), (0.5, 1.0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_upsample_nearest(sh, sw, dtype):
    x = X.astype(dtype)
    (got,) = run(lambda x: mb.upsample_nearest_neighbor(x=x, scale_factor_height=sh, scale_factor_width=sw), {"x": x})
    want = F.interpolate(torch.from_numpy(X), size=(int(4 * sh), int(6 * sw)), mode="nearest").numpy()
    assert got.dtype == dtype
    assert_close(got, want.astype(dtype))


@pytest.mark.parametrize("align", [True, False])
@pytest.mark.parametrize("sh,sw", [(2.0, 3.0), (1.0, 0.5), (3.0, 1.0)])
def test_upsample_bilinear_vs_torch(align, sh, sw):
    (got,) = run(lambda x: mb.upsample_bilinear(x=x, scale_factor_height=sh, scale_factor_width=sw, align_corners=align),
                 {"x": X})
    want = F.interpolate(torch.from_numpy(X), scale_factor=(sh, sw), mode="bilinear", align_corners=align,
                         recompute_scale_factor=True).numpy()
    assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_upsample_bilinear_half_pixel_false_ios16():
    x = np.arange(2, dtype=np.float32).reshape(1, 1, 1, 2)
    (got,) = run(lambda x: mb.upsample_bilinear(x=x, scale_factor_width=2.5, align_corners=False,
                                                half_pixel_centers=False), {"x": x}, opset=16)
    assert_close(got[0, 0, 0], [0.0, 0.4, 0.8, 1.0, 1.0], rtol=1e-6)  # grid i * in / out


def test_upsample_linear_1d_like_kokoro():
    """Kokoro's SineGen: F.interpolate(linear, scale 1/300 then 300) as converted by ct."""
    x = R.standard_normal((1, 9, 1200, 1)).astype(np.float32)
    (down,) = run(lambda x: mb.upsample_bilinear(x=x, scale_factor_height=np.float32(1 / 300), align_corners=False),
                  {"x": x})
    want = F.interpolate(torch.from_numpy(x[..., 0]), scale_factor=1 / 300, mode="linear").numpy()
    assert_close(down[..., 0], want, rtol=1e-5, atol=1e-5)
    y = R.standard_normal((1, 9, 4, 1)).astype(np.float32)
    (up,) = run(lambda x: mb.upsample_bilinear(x=x, scale_factor_height=300, align_corners=False), {"x": y})
    want = F.interpolate(torch.from_numpy(y[..., 0]), scale_factor=300, mode="linear").numpy()
    assert_close(up[..., 0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "mode,out,grid",
    [
        ("UNALIGN_CORNERS", 5, [0.0, 0.1, 0.5, 0.9, 1.0]),
        ("STRICT_ALIGN_CORNERS", 5, [0.0, 0.25, 0.5, 0.75, 1.0]),
        ("ALIGN_CORNERS", 5, [0.0, 0.25, 0.5, 0.75, 1.0]),
        ("DEFAULT", 5, [0.0, 0.4, 0.8, 1.0, 1.0]),
        ("OFFSET_CORNERS", 5, [0.1, 0.3, 0.5, 0.7, 0.9]),
        ("UNALIGN_CORNERS", 6, [0.0, 0.0, 1 / 3, 2 / 3, 1.0, 1.0]),
        ("DEFAULT", 6, [0.0, 1 / 3, 2 / 3, 1.0, 1.0, 1.0]),
        ("OFFSET_CORNERS", 6, [1 / 12, 0.25, 5 / 12, 7 / 12, 0.75, 11 / 12]),
    ],
)
def test_resize_bilinear_doc_grids(mode, out, grid):
    """Input [0, 1] sampled on the grids listed in the op documentation."""
    x = np.array([0.0, 1.0], np.float32).reshape(1, 1, 1, 2)
    (got,) = run(lambda x: mb.resize_bilinear(x=x, target_size_height=1, target_size_width=out, sampling_mode=mode),
                 {"x": x})
    assert_close(got[0, 0, 0], grid, rtol=1e-5, atol=1e-6)


def test_resize_nearest():
    (got,) = run(lambda x: mb.resize_nearest_neighbor(x=x, target_size_height=8, target_size_width=9), {"x": X})
    want = F.interpolate(torch.from_numpy(X), size=(8, 9), mode="nearest").numpy()
    assert_close(got, want)
