"""A strided ConvTranspose1d as a stride-1 Conv1d and a pixel shuffle, exactly.

The generator upsamples ×10 and ×6 by transposed convolutions; strides above 2 are named among the
causes of the Neural Engine compiler's failures on the Kokoro generator (docs/ane-notes.md §3, the
lint's `ane_unfriendly_ops`). Output sample q·s + r of a transposed convolution is a plain
convolution of the input with the taps k ≡ r + p (mod s): `s` phases, one stride-1 convolution with
s × C_out channels, interleaved by a reshape. Same products, same sums: equal up to rounding order.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SubPixelConv(nn.Module):
    """`ConvTranspose1d(C_in, C_out, K, stride=s, padding=p)` with K − 2p = s (output length T·s)."""

    def __init__(self, up: nn.ConvTranspose1d):
        super().__init__()
        (s,), (p,), (K,) = up.stride, up.padding, up.kernel_size
        if K - 2 * p != s or up.output_padding[0] or up.dilation[0] != 1 or up.groups != 1:
            raise ValueError(f"SubPixelConv takes a transposed conv with kernel - 2·padding = stride, got "
                             f"kernel {K}, stride {s}, padding {p}")
        w = up.weight.detach()  # (C_in, C_out, K); a weight-normed conv's effective weight
        c_in, c_out = w.shape[0], w.shape[1]
        # output q·s + r reads input q − j through tap j·s + r + p, for every j with the tap in [0, K)
        js = [j for r in range(s) for j in range(-K, K + 1) if 0 <= j * s + r + p < K]
        self.j_lo, self.j_hi, self.stride = min(js), max(js), s
        taps = self.j_hi - self.j_lo + 1
        weight = torch.zeros(c_out, s, c_in, taps, dtype=w.dtype)
        for r in range(s):
            for t in range(taps):
                k = (self.j_hi - t) * s + r + p
                if 0 <= k < K:
                    weight[:, r, :, t] = w[:, :, k].T
        self.register_buffer("weight", weight.reshape(c_out * s, c_in, taps))
        bias = up.bias.detach() if up.bias is not None else torch.zeros(c_out, dtype=w.dtype)
        self.register_buffer("bias", bias.repeat_interleave(s))
        self.c_out = c_out

    def forward(self, x):
        """(B, C_in, T) → (B, C_out, T·s)."""
        y = F.conv1d(F.pad(x, (self.j_hi, -self.j_lo)), self.weight, self.bias)  # (B, C_out·s, T)
        b, _, t = y.shape
        return y.reshape(b, self.c_out, self.stride, t).transpose(2, 3).reshape(b, self.c_out, t * self.stride)
