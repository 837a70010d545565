"""Padding-safe versions of upstream Kokoro blocks, built from upstream's own modules.

A static bucket pads the sequence; upstream code assumes the exact length. Padding leaks into
the valid region three ways (docs/ane-notes.md §5): instance-norm statistics over padded frames, AdaIN's
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


def _masked_centred(x: torch.Tensor, m: torch.Tensor, eps: float, x_masked: bool, consume: bool = False,
                    stats: "Stats | None" = None):
    """(x - mean)/prescale on valid frames (0 on padding) and the matching 1/std, per channel.

    Ratio of means, not sums: sums over 144k frames overflow fp16, means do not. `x_masked`
    says x is already 0 on padding, which saves one full-size multiply; `consume` lets the
    result overwrite x (a fresh conv output nobody reads again), which saves an allocation.
    `stats`: the frames the statistics are taken over, when not all of m's (a folded sequence).
    """
    if stats is not None:
        return _folded_centred(x, m, eps, stats)
    frac = m.mean(-1, keepdim=True)
    if consume and not x_masked:
        x, x_masked = x.mul_(m), True
    mean = (x if x_masked else x * m).mean(-1, keepdim=True) / frac
    centred = (x.sub_(mean) if consume else x - mean).mul_(m * (1.0 / _VAR_PRESCALE))
    var_scaled = (centred * centred).mean(-1, keepdim=True) / frac
    return centred, torch.rsqrt(var_scaled + eps / _VAR_PRESCALE**2)


class Stats:
    """Which frames instance-norm statistics are taken over in a sequence folded into rows
    (batch R, each row a window with halos): `mask` (R, 1, T) is 1 on each valid frame's one
    counted copy, its row's centre, and 0 on halos and padding; the mean runs over rows and time,
    so every layer normalizes by the whole sequence's statistics, as upstream does."""

    def __init__(self, mask: torch.Tensor):
        self.mask = mask
        self.frac = mask.mean((0, 2), keepdim=True)


def _folded_centred(x: torch.Tensor, m: torch.Tensor, eps: float, stats: Stats):
    sm, frac = stats.mask, stats.frac
    mean = (x * sm).mean((0, 2), keepdim=True) / frac
    centred = (x - mean) * (m * (1.0 / _VAR_PRESCALE))  # halos keep their values: the next conv reads them
    var_scaled = (centred * centred * sm).mean((0, 2), keepdim=True) / frac
    return centred, torch.rsqrt(var_scaled + eps / _VAR_PRESCALE**2)


def adain(block, x: torch.Tensor, s: torch.Tensor, m: torch.Tensor, x_masked: bool = False,
          consume: bool = False, stats: Stats | None = None) -> torch.Tensor:
    """Upstream `AdaIN1d.forward` with masked statistics; padded frames come out zero.

    Norm, affine and style fold into one per-channel scale and shift, so the full-size work is
    the statistics plus `(centred * scale + shift) * m` (the generator runs this 48 times at 24 kHz).
    In-place ops only touch fresh temporaries (CoreML converts them as the functional op); on the
    torch backend they save a 100+ MB allocation each at the 30 s bucket.
    """
    h = block.fc(s).unsqueeze(-1)
    gamma, beta = torch.chunk(h, chunks=2, dim=1)
    norm = block.norm
    centred, rstd = _masked_centred(x, m, norm.eps, x_masked, consume, stats)
    scale, shift = rstd * (1 + gamma), beta
    if norm.affine:
        shift = norm.bias.view(1, -1, 1) * (1 + gamma) + beta
        scale = scale * norm.weight.view(1, -1, 1)
    return centred.mul_(scale).add_(shift).mul_(m)


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


def _snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Snake1D x + sin(αx)²/α; maps 0 to 0, so a masked input stays masked."""
    return (alpha * x).sin_().pow_(2).mul_(_reciprocal(alpha)).add_(x)


def adain_resblock1(block, x: torch.Tensor, s: torch.Tensor, m: torch.Tensor, stats: Stats | None = None) -> torch.Tensor:
    """Upstream istftnet `AdaINResBlock1.forward` (Snake activations, dilated convs).

    x must be 0 on padding. AdaIN outputs are 0 on padding and Snake keeps them so, so the convs'
    inputs need no mask; the convs' outputs do (bias and kernel spill), via the next AdaIN's
    statistics and the residual sum.
    """
    for c1, c2, n1, n2, a1, a2 in zip(block.convs1, block.convs2, block.adain1, block.adain2, block.alpha1, block.alpha2):
        xt = c1(_snake(adain(n1, x, s, m, x_masked=True, stats=stats), a1))
        xt = c2(_snake(adain(n2, xt, s, m, consume=True, stats=stats), a2))
        x = xt.add_(x).mul_(m)
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
    Unrolling cells instead gives >100k ops (docs/ane-notes.md §5).
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
