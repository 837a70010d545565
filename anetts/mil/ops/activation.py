"""Activation ops (MIL ``iOS15/activation.py`` + iOS17 overrides) and softmax.

All are computed in fp32 and rounded once to the declared output dtype.  Per-channel
parameters (``prelu`` alpha, ``softplus_parametric`` alpha/beta) apply along axis 1.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import Kernel, Node, Unsupported, register
from ._util import fp16_aware


def _k(node: Node, fn, key=None) -> Kernel:
    """``key`` (hashable, incl. the op's scalar parameters) enables the native-half fast
    path when it is exact enough (see ``_util.fp16_aware``); None always widens."""
    return Kernel(fp16_aware(fn, node.out_dtype, key), ["x"])


@register("relu")
def _relu(node):
    return _k(node, torch.relu, "relu")


@register("relu6")
def _relu6(node):
    return _k(node, lambda x: torch.clamp(x, 0.0, 6.0), "relu6")


@register("sigmoid")
def _sigmoid(node):
    return _k(node, torch.sigmoid, "sigmoid")


@register("silu")
def _silu(node):
    return _k(node, F.silu, "silu")


@register("softsign")
def _softsign(node):
    return _k(node, F.softsign, "softsign")


@register("softplus")
def _softplus(node):
    # log(1 + exp(x)); torch's threshold (x > 20 -> x) is exact to fp32 precision
    return _k(node, F.softplus, "softplus")


@register("gelu")
def _gelu(node: Node):
    mode = node.str("mode", "EXACT") if node.has("mode") else "EXACT"
    if mode == "EXACT":
        fn = F.gelu
    elif mode == "TANH_APPROXIMATION":
        fn = lambda x: F.gelu(x, approximate="tanh")  # noqa: E731
    elif mode == "SIGMOID_APPROXIMATION":
        fn = lambda x: x * torch.sigmoid(1.702 * x)  # noqa: E731
    else:
        raise Unsupported(f"gelu mode {mode!r}")
    return _k(node, fn, ("gelu", mode))


@register("leaky_relu")
def _leaky_relu(node: Node):
    alpha = node.float("alpha")
    return _k(node, lambda x: torch.where(x >= 0, x, x * alpha), ("leaky_relu", alpha))


@register("elu")
def _elu(node: Node):
    alpha = node.float("alpha")
    return _k(node, lambda x: torch.where(x < 0, alpha * torch.expm1(x), x), ("elu", alpha))


@register("thresholded_relu")
def _thresholded_relu(node: Node):
    alpha = node.float("alpha")
    return _k(node, lambda x: torch.where(x > alpha, x, torch.zeros((), dtype=x.dtype)), ("thresholded_relu", alpha))


@register("clamped_relu")
def _clamped_relu(node: Node):
    alpha, beta = node.float("alpha"), node.float("beta")
    return _k(node, lambda x: torch.where(x >= 0, torch.clamp_max(x, beta), torch.clamp_max(x * alpha, beta)),
              ("clamped_relu", alpha, beta))


@register("linear_activation")
def _linear_activation(node: Node):
    alpha, beta = node.float("alpha"), node.float("beta")
    return _k(node, lambda x: x * alpha + beta, ("linear_activation", alpha, beta))


@register("scaled_tanh")
def _scaled_tanh(node: Node):
    alpha, beta = node.float("alpha"), node.float("beta")
    return _k(node, lambda x: alpha * torch.tanh(x * beta), ("scaled_tanh", alpha, beta))


@register("sigmoid_hard")
def _sigmoid_hard(node: Node):
    alpha, beta = node.float("alpha"), node.float("beta")
    return _k(node, lambda x: torch.clamp(x * alpha + beta, 0.0, 1.0), ("sigmoid_hard", alpha, beta))


def _channel_param(node: Node, name: str) -> torch.Tensor:
    p = node.tensor(name, torch.float32).reshape(-1)
    rank = node.input_rank("x")
    if rank is None:
        raise Unsupported("input rank unknown")
    return p.reshape((1, -1) + (1,) * (rank - 2)) if rank >= 2 else p


@register("prelu")
def _prelu(node: Node):
    alpha = _channel_param(node, "alpha")
    return _k(node, lambda x: torch.where(x > 0, x, x * alpha))


@register("softplus_parametric")
def _softplus_parametric(node: Node):
    alpha, beta = _channel_param(node, "alpha"), _channel_param(node, "beta")
    return _k(node, lambda x: alpha * torch.log1p(torch.exp(x * beta)))


@register("softmax")
def _softmax(node: Node):
    axis = node.int("axis", -1) if node.has("axis") else -1
    return _k(node, lambda x: torch.softmax(x, axis))

