"""The generator body over a sequence folded into rows with halos (anetts.models.kokoro.fold) equals
the whole run over every valid frame, and a halo short of the body's reach does not."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from anetts.models.kokoro.dsp import KOKORO
from anetts.models.kokoro.fold import MAX_AXIS, FoldedBody, FoldGeometry, halo_frames
from anetts.models.kokoro.stages.generator import GeneratorModule, GeneratorStage

SECONDS = 7  # 560 frames at 80 Hz: three rows, so two row boundaries inside the sequence


@pytest.fixture(scope="module")
def body_run(tiny_model, tiny_weights):
    """The whole body's conv_post output (float64), its inputs and the module."""
    inputs = GeneratorStage().example_inputs(tiny_model, tiny_weights, SECONDS)
    inputs = {k: v.astype(np.float64) for k, v in inputs.items()}
    module = GeneratorModule(tiny_model).eval().double()
    t = {k: torch.from_numpy(v) for k, v in inputs.items()}
    with torch.inference_mode():
        whole, _ = module.body(t["x_pre"], t["ref_s"][:, :KOKORO.style_dim], t["har"], t["mask"])
    valid = int(inputs["mask"].sum()) * 60 + 1  # 4,800 Hz frames, the reflection pad's included
    return module, inputs, whole.numpy()[..., :valid]


def _folded(module, inputs, halo: int, length: int) -> np.ndarray:
    g = FoldGeometry.for_bucket(inputs["mask"].shape[-1], halo, 60)
    rows = [g.fold(inputs["x_pre"]), inputs["ref_s"][:, :KOKORO.style_dim], g.fold(inputs["har"], 60, 1),
            g.fold(inputs["mask"])]
    with torch.inference_mode():
        out = FoldedBody(module, g)(*(torch.from_numpy(np.ascontiguousarray(a)) for a in rows)).numpy()
    assert g.rows == 3
    return g.unfold(out, length)


def test_the_folded_body_equals_the_whole_over_every_valid_frame(body_run, tiny_model):
    module, inputs, whole = body_run
    got = _folded(module, inputs, halo_frames(tiny_model.decoder.generator), whole.shape[-1])
    # float64: what is left is rounding (the statistics sum rows in another order), 1e-13 of the scale
    assert np.abs(got - whole).max() <= 1e-9 * np.abs(whole).max()


def test_a_halo_short_of_the_reach_breaks_the_row_boundaries(body_run, tiny_model):
    module, inputs, whole = body_run
    short = halo_frames(tiny_model.decoder.generator) - 2
    got = _folded(module, inputs, short, whole.shape[-1])
    err = np.abs(got - whole).max(axis=(0, 1))
    assert err.max() > 1e-6 * np.abs(whole).max()
    g = FoldGeometry.for_bucket(inputs["mask"].shape[-1], short, 60)
    boundary = g.valid * 60  # the first row boundary, at 4,800 Hz
    assert np.argmax(err) in range(boundary - short * 60, boundary + short * 60)


def test_every_bucket_folds_under_the_widest_axis(tiny_model):
    halo = halo_frames(tiny_model.decoder.generator)
    for seconds in (3, 7, 10, 15, 30):
        g = FoldGeometry.for_bucket(KOKORO.f0_frames(seconds), halo, 60)
        assert g.width * 60 + 1 <= MAX_AXIS
        assert g.rows * g.valid >= KOKORO.f0_frames(seconds) + 1  # the centres cover every frame
    ramp = np.arange(2 * 800, dtype=np.float32).reshape(1, 2, 800)
    g = FoldGeometry.for_bucket(800, halo, 1, max_axis=61)  # rows of 60 frames, 1:1
    rows = g.fold(ramp)
    assert np.array_equal(g.unfold(rows[..., halo:halo + g.valid], 800), ramp)
    assert rows[0, 0, :halo].tolist() == [0.0] * halo  # before the sequence: zeros
    with pytest.raises(ValueError, match="leaves no centre"):
        FoldGeometry.for_bucket(800, 200, 60)
