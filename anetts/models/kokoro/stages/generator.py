"""Stage `generator`: decoder features + harmonic source spectrum `har` → 24 kHz waveform.

Upstream `decoder.generator` minus `m_source` and the forward STFT (host DSP makes `har`):
noise_convs, noise_res, ups, resblocks, reflection_pad, conv_post, exp/sin and the inverse STFT.
CoreML has no `istft`, so the inverse is a conv_transpose1d with the one-sided scaling (1/N for DC
and Nyquist, 2/N elsewhere) and the window-power normalization torch.istft applies; the window
envelope is built from the frame mask so the last valid samples match upstream's exact length.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from anetts.models.kokoro import masked
from anetts.models.kokoro.reference import example_for_seconds
from anetts.models.kokoro.dsp import KOKORO, frame_mask, pad_last
from anetts.models.kokoro.stages.base import EXAMPLE_VOICE, KokoroStage
from anetts.models.kokoro.subpixel import SubPixelConv
from anetts.tensors import MAIN_FUNCTION, FunctionSpec, TensorSpec


class InverseSTFT(nn.Module):
    """torch.istft(center=True, onesided, periodic Hann) as conv_transpose1d, masked by frames."""

    def __init__(self, n_fft: int, hop: int):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        bins = n_fft // 2 + 1
        n = torch.arange(n_fft, dtype=torch.float64)
        k = torch.arange(bins, dtype=torch.float64).unsqueeze(1)
        window = torch.hann_window(n_fft, periodic=True, dtype=torch.float64)
        scale = torch.full((bins, 1), 2.0 / n_fft, dtype=torch.float64)
        scale[0] = scale[-1] = 1.0 / n_fft  # DC and Nyquist appear once in a one-sided spectrum
        angle = 2 * math.pi * k * n / n_fft
        self.register_buffer("w_real", (scale * torch.cos(angle) * window).float().unsqueeze(1))
        self.register_buffer("w_imag", (-scale * torch.sin(angle) * window).float().unsqueeze(1))
        self.register_buffer("w_power", (window**2).float().view(1, 1, -1))

    def forward(self, magnitude, phase, frame_mask):
        """magnitude, phase (1, bins, N), frame_mask (1, 1, N) → (1, 1, (N-1)·hop)."""
        n_frames = magnitude.shape[-1]
        magnitude = magnitude * frame_mask
        signal = F.conv_transpose1d(magnitude * torch.cos(phase), self.w_real, stride=self.hop) + F.conv_transpose1d(
            magnitude * torch.sin(phase), self.w_imag, stride=self.hop)
        envelope = F.conv_transpose1d(frame_mask, self.w_power, stride=self.hop)
        # padding frames have an empty envelope; their signal is 0, so any divisor ≥ tiny works
        signal = signal / torch.clamp(envelope, min=1e-3)
        start = self.n_fft // 2
        return signal[..., start : start + (n_frames - 1) * self.hop]


class Spectrum(nn.Module):
    """conv_post output (1, 2·bins, N) → magnitude exp(x[:bins]) and phase sin(x[bins:]), as upstream.

    A module of its own so that the tail has a torch scope of its own: a stage's `fp32_ops` can
    select it (`module:spectrum`) with conv_post, whose log-magnitude exp() turns fp16's absolute
    error into a relative error of the magnitude.
    """

    def __init__(self, bins: int):
        super().__init__()
        self.bins = bins

    def forward(self, x):
        return torch.exp(x[:, : self.bins, :]), torch.sin(x[:, self.bins :, :])


class GeneratorModule(nn.Module):
    """`subpixel`: the upsampling transposed convolutions as stride-1 convolutions and a pixel shuffle
    (kokoro.subpixel), the same products and sums."""

    def __init__(self, model, subpixel: bool = False):
        super().__init__()
        gen = model.decoder.generator
        self.noise_convs, self.noise_res, self.ups, self.resblocks = gen.noise_convs, gen.noise_res, gen.ups, gen.resblocks
        if subpixel:
            self.ups = nn.ModuleList(SubPixelConv(u) for u in gen.ups)
        self.conv_post, self.reflection_pad = gen.conv_post, gen.reflection_pad
        self.num_kernels, self.post_n_fft = gen.num_kernels, gen.post_n_fft
        self.rates = [u.stride[0] for u in gen.ups]
        self.spectrum = Spectrum(gen.post_n_fft // 2 + 1)
        self.istft = InverseSTFT(gen.post_n_fft, gen.stft.hop_length)
        # a Python int, so tracing records a constant repeat rather than a shape computation
        self.samples_per_frame = gen.stft.hop_length * math.prod(self.rates)

    def forward(self, x_pre, ref_s, har, mask):
        x, m = self.body(x_pre, ref_s[:, :KOKORO.style_dim], har, mask)
        spec, phase = self.spectrum(x)
        waveform = self.istft(spec, phase, m)
        # zero everything after the last valid sample (window tails of the last frame)
        return waveform * masked.upsample_mask(mask, self.samples_per_frame)

    def body(self, x_pre, s, har, mask, fold=None):
        """Upsampling, Snake resblocks and the noise branch → conv_post's output (rows, 2·bins, har
        frames) and its frames' mask. `fold`: the sequence is folded into rows with halos."""
        x, m = x_pre * mask, mask
        sm = None if fold is None else fold.centre * mask
        last = len(self.ups) - 1
        for i, (up, noise_conv, noise_res) in enumerate(zip(self.ups, self.noise_convs, self.noise_res)):
            m_up = masked.upsample_mask(m, self.rates[i])
            sm = None if sm is None else masked.upsample_mask(sm, self.rates[i])
            if i == last:  # the reflection pad prepends one frame, which is valid
                m_up = torch.cat([m_up[..., :1], m_up], dim=-1)
                if fold is not None:  # every row was padded; only row 0 holds the sequence's first frame
                    sm = torch.cat([sm[..., :1], sm], dim=-1)
                    m_up, sm = m_up + fold.first * (1 - m_up), sm + fold.first * (1 - sm)
            stats = None if sm is None else masked.Stats(sm)
            x = F.leaky_relu(x, negative_slope=0.1)
            x_source = masked.adain_resblock1(noise_res, noise_conv(har).mul_(m_up), s, m_up, stats)
            x = up(x)  # x is 0 on padding (masked resblock outputs; leaky_relu(0) = 0)
            if i == last:
                x = self.reflection_pad(x)
                if fold is not None:  # there, upstream's reflection of the sequence: x[1], two frames on
                    x = x + fold.first * (F.pad(x[..., 2:], (0, 2)) - x)
            x = x.add_(x_source).mul_(m_up)  # in place on fresh conv outputs (see masked.adain)
            xs = masked.adain_resblock1(self.resblocks[i * self.num_kernels], x, s, m_up, stats)
            for j in range(1, self.num_kernels):
                xs = xs.add_(masked.adain_resblock1(self.resblocks[i * self.num_kernels + j], x, s, m_up, stats))
            x, m = xs.div_(self.num_kernels), m_up
        return self.conv_post(F.leaky_relu(x)), m


class GeneratorStage(KokoroStage):
    name = "generator"
    components = ("decoder",)
    description = "Kokoro iSTFTNet generator from host-computed har"

    def function(self, size: int) -> FunctionSpec:
        g = self.geometry(size)
        return FunctionSpec(
            MAIN_FUNCTION,
            inputs=(
                TensorSpec("x_pre", (1, 512, g["f0_frames"]), "float32", "decoder features (80 Hz)"),
                TensorSpec("ref_s", (1, KOKORO.ref_s_dim), "float32", "voice style; [:, :style_dim] is the decoder style"),
                TensorSpec("har", (1, 22, g["har_frames"]), "float32",
                           "STFT magnitude (11) and phase (11) of the hn-NSF source, zero padded"),
                TensorSpec("mask", (1, 1, g["f0_frames"]), "float32", "1 for valid 80 Hz frames, 0 for padding"),
            ),
            outputs=(TensorSpec("waveform", (1, 1, g["samples"]), "float32", "24 kHz audio; trim to frames×600"),),
        )

    def valid_regions(self, inputs) -> dict:
        # mask is at 80 Hz: 300 samples per frame
        return {"waveform": (2, 300 * int(inputs["mask"].sum()))}

    def build(self, model) -> nn.Module:
        return GeneratorModule(model).eval()

    def example_inputs(self, model, weights_dir: Path, size: int, reference=None) -> dict[str, np.ndarray]:
        ref = reference if reference is not None else example_for_seconds(model, weights_dir, size, EXAMPLE_VOICE)
        g = self.geometry(size)
        return {
            "x_pre": pad_last(ref["x_pre"], g["f0_frames"]),
            "ref_s": ref["ref_s"],
            "har": pad_last(ref["har"], g["har_frames"]),
            "mask": frame_mask(ref["x_pre"].shape[-1], g["f0_frames"]),
        }
