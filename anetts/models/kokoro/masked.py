"""Padding-safe versions of upstream Kokoro blocks, built from upstream's own modules.

A static bucket pads the sequence; upstream code assumes the exact length. Padding leaks into
the valid region three ways (kokoro.md §6): instance-norm statistics over padded frames, AdaIN's
beta added to padded frames and then read by the next convolution, and the backward LSTM reading
padding first. Every function here takes a float validity mask `m` (1 valid, 0 padding) and
reproduces upstream on the valid region exactly, reading parameters from upstream modules.

Shapes: x (B, C, T) unless noted, m (B, 1, T).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# (x - mean) is divided by this before squaring: decoder activations reach |x| ≈ 330
# (kokoro-82m/activation_ranges.json) and 330² overflows fp16 (max 65504).
_VAR_PRESCALE = 8.0
_INV_SQRT2 = 1.0 / math.sqrt(2.0)


def masked_instance_norm(x: torch.Tensor, m: torch.Tensor, weight, bias, eps: float) -> torch.Tensor:
    """InstanceNorm1d over the valid frames only (biased variance, like torch)."""
    # ratio of means, not sums: sums over 144k frames overflow fp16, means do not
    frac = m.mean(-1, keepdim=True)
    mean = (x * m).mean(-1, keepdim=True) / frac
    centred = (x - mean) * m / _VAR_PRESCALE
    var_scaled = (centred * centred).mean(-1, keepdim=True) / frac
    y = centred * torch.rsqrt(var_scaled + eps / _VAR_PRESCALE**2)
    if weight is not None:
        y = y * weight.view(1, -1, 1) + bias.view(1, -1, 1)
    return y


def adain(block, x: torch.Tensor, s: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Upstream `AdaIN1d.forward` with masked statistics; padded frames come out zero."""
    h = block.fc(s).unsqueeze(-1)
    gamma, beta = torch.chunk(h, chunks=2, dim=1)
    norm = block.norm
    x = masked_instance_norm(x, m, norm.weight if norm.affine else None, norm.bias if norm.affine else None, norm.eps)
    return ((1 + gamma) * x + beta) * m


def upsample_mask(m: torch.Tensor, factor: int) -> torch.Tensor:
    return torch.repeat_interleave(m, factor, dim=-1)


def adain_resblk(block, x: torch.Tensor, s: torch.Tensor, m: torch.Tensor):
    """Upstream `AdainResBlk1d.forward`; returns (out, mask of out) since it may upsample 2x."""
    upsampling = block.upsample_type != "none"
    m_out = upsample_mask(m, 2) if upsampling else m
    # residual branch (dropout is identity in eval)
    r = block.actv(adain(block.norm1, x, s, m)) * m
    r = block.pool(r) * m_out
    r = block.conv1(r) * m_out
    r = block.actv(adain(block.norm2, r, s, m_out)) * m_out
    r = block.conv2(r)
    # shortcut branch
    sc = F.interpolate(x, scale_factor=2, mode="nearest") if upsampling else x
    if block.learned_sc:
        sc = block.conv1x1(sc)
    # upstream multiplies by rsqrt(tensor(2)), an int tensor CoreML cannot take rsqrt of
    return (r + sc) * _INV_SQRT2 * m_out, m_out


def _reciprocal(a: torch.Tensor) -> torch.Tensor:
    # `1 / a` converts to MIL `inverse`, which computes 1/(a + 1e-4); a true division does not
    return torch.ones_like(a) / a


def adain_resblock1(block, x: torch.Tensor, s: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Upstream istftnet `AdaINResBlock1.forward` (Snake activations, dilated convs)."""
    for c1, c2, n1, n2, a1, a2 in zip(block.convs1, block.convs2, block.adain1, block.adain2, block.alpha1, block.alpha2):
        xt = adain(n1, x, s, m)
        xt = xt + _reciprocal(a1) * (torch.sin(a1 * xt) ** 2)
        xt = c1(xt * m)
        xt = adain(n2, xt, s, m)
        xt = xt + _reciprocal(a2) * (torch.sin(a2 * xt) ** 2)
        xt = c2(xt * m)
        x = (xt + x) * m
    return x


def _unidirectional(lstm: nn.LSTM, suffix: str) -> nn.LSTM:
    one = nn.LSTM(lstm.input_size, lstm.hidden_size, num_layers=1, batch_first=True, bidirectional=False)
    with torch.no_grad():
        for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
            getattr(one, name).copy_(getattr(lstm, name + suffix))
    return one.eval()


class MaskedBiLSTM(nn.Module):
    """A bidirectional single-layer LSTM that ignores trailing padding, from two stock LSTMs.

    Equals upstream's `pack_padded_sequence` path on the valid prefix. The forward direction
    runs over the padded input (trailing padding cannot reach the prefix). The backward
    direction is a forward LSTM with the `_reverse` weights over the valid prefix reversed by a
    gather with r[t] = clamp(valid-1-t, 0, T-1); gathering its output with r undoes the reversal.
    Unrolling cells instead gives >100k ops (kokoro.md §6).
    """

    def __init__(self, lstm: nn.LSTM):
        super().__init__()
        if not (lstm.bidirectional and lstm.num_layers == 1 and lstm.batch_first):
            raise ValueError("MaskedBiLSTM expects a batch_first, single-layer, bidirectional nn.LSTM")
        self.fwd = _unidirectional(lstm, "")
        self.bwd = _unidirectional(lstm, "_reverse")

    def forward(self, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """x (B, T, C), m (B, T, 1) → (B, T, 2H), zero on padding."""
        steps = x.shape[1]
        x = x * m
        out_f, _ = self.fwd(x)
        valid = m.sum(dim=1).to(torch.int32).view(-1)[0:1]  # batch 1: one length
        t = torch.arange(steps, dtype=torch.int32)
        r = torch.clamp(valid - 1 - t, 0, steps - 1)
        out_b, _ = self.bwd(torch.index_select(x, 1, r))
        out_b = torch.index_select(out_b, 1, r)
        return torch.cat([out_f, out_b], dim=-1) * m
