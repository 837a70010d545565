"""Activations and softmax vs value_inference (fp32 and fp16)."""
from __future__ import annotations

import numpy as np
import pytest
from coremltools.converters.mil.mil import Builder as mb

from miltest import check_vs_value_inference, rng, run, value_inference, assert_close

X = (rng(2).standard_normal((2, 4, 6)) * 3).astype(np.float32)


def _cases(dt):
    a, b = dt(0.3), dt(1.7)
    alpha_c = np.linspace(0.1, 0.9, 4).astype(dt)
    beta_c = np.linspace(0.5, 2.0, 4).astype(dt)
    return {
        "gelu_exact": lambda x: mb.gelu(x=x),
        "gelu_tanh": lambda x: mb.gelu(x=x, mode="TANH_APPROXIMATION"),
        "gelu_sigmoid": lambda x: mb.gelu(x=x, mode="SIGMOID_APPROXIMATION"),
        "leaky_relu": lambda x: mb.leaky_relu(x=x, alpha=a),
        "elu": lambda x: mb.elu(x=x, alpha=b),
        "thresholded_relu": lambda x: mb.thresholded_relu(x=x, alpha=b),
        "clamped_relu": lambda x: mb.clamped_relu(x=x, alpha=a, beta=b),
        "linear_activation": lambda x: mb.linear_activation(x=x, alpha=a, beta=b),
        "scaled_tanh": lambda x: mb.scaled_tanh(x=x, alpha=b, beta=a),
        "sigmoid_hard": lambda x: mb.sigmoid_hard(x=x, alpha=a, beta=dt(0.5)),
        # rank-4 input: pymil only accepts per-channel prelu alpha for rank 4
        "prelu": lambda x: mb.prelu(x=mb.expand_dims(x=x, axes=[-1]), alpha=alpha_c),
        "softplus_parametric": lambda x: mb.softplus_parametric(x=x, alpha=alpha_c, beta=beta_c),
        "softmax_last": lambda x: mb.softmax(x=x, axis=-1),
        "softmax_axis1": lambda x: mb.softmax(x=x, axis=1),
        "relu": lambda x: mb.relu(x=x),
        "silu": lambda x: mb.silu(x=x),
    }


@pytest.mark.parametrize("name", sorted(_cases(np.float32)))
def test_activation_fp32(name):
    build = _cases(np.float32)[name]
    if name == "silu":  # silu has no value_inference
        (got,) = run(build, {"x": X})
        assert_close(got, X / (1 + np.exp(-X)), rtol=1e-6, atol=1e-6)
        return
    check_vs_value_inference(build, {"x": X}, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("name", sorted(set(_cases(np.float16)) - {"silu"}))
def test_activation_fp16(name):
    """fp16: fp32 computation rounded once, i.e. within ~1 ulp of the fp32 reference."""
    x16 = X.astype(np.float16)
    (got,) = run(_cases(np.float16)[name], {"x": x16})
    assert got.dtype == np.float16
    (want,) = value_inference(_cases(np.float32)[name], {"x": x16.astype(np.float32)})
    assert_close(got, want.astype(np.float16), rtol=2e-3, atol=2e-3)
