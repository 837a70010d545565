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
from anetts.models.kokoro.dsp import HAR_CHANNELS, KOKORO, frame_mask, pad_last
from anetts.models.kokoro.fold import HALO, FoldGeometry, halo_frames
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


class Fold:
    """The constant masks of a folded run (traced as constants of the program): `centre` is 1 on each
    row's centre at 80 Hz, `first` on the sequence's first frame after the reflection pad (row 0)."""

    def __init__(self, g: FoldGeometry):
        self.centre = F.pad(torch.ones(g.rows, 1, g.valid), (g.halo, g.halo))
        first = g.halo * g.upsample
        self.first = F.pad(torch.ones(1, 1, 1), (first, g.width * g.upsample - first, 0, 0, 0, g.rows - 1))


class FoldedBody(nn.Module):
    """The generator body over a sequence folded into rows (kokoro.fold), upsampling by sub-pixel
    convolutions → conv_post's output at the rows' centres, 0 after the last valid frame."""

    def __init__(self, model, halo: int = HALO):
        super().__init__()
        self.generator, self.halo = GeneratorModule(model, subpixel=True), halo

    def forward(self, x_rows, ref_s, har_rows, mask_rows):
        g = FoldGeometry(x_rows.shape[0], x_rows.shape[-1], self.halo)
        x, m = self.generator.body(x_rows, ref_s[:, :KOKORO.style_dim], har_rows, mask_rows, Fold(g))
        start = g.halo * g.upsample
        return (x * m)[..., start:start + g.valid * g.upsample]


class GeneratorStage(KokoroStage):
    """`layout`: `whole` (the GPU layout: one row, the tail in the graph, output the waveform) or
    `folded` (the ANE layout: rows of at most 16,384 body frames with halos, sub-pixel upsampling,
    output conv_post's spectrum; the host runs exp, sin and the inverse STFT, dsp.spectrum_to_audio)."""

    name = "generator"
    components = ("decoder",)
    description = "Kokoro iSTFTNet generator from host-computed har"
    LAYOUTS = ("whole", "folded")

    def __init__(self, layout: str = "whole"):
        if layout not in self.LAYOUTS:
            raise ValueError(f"generator layout {layout!r}: choose one of {list(self.LAYOUTS)}")
        self.layout = layout

    def configure(self, params: dict) -> "GeneratorStage":
        return GeneratorStage(params.get("layout", "whole"))

    def fold(self, size: int) -> FoldGeometry:
        return FoldGeometry.for_frames(self.geometry(size)["f0_frames"])

    def function(self, size: int) -> FunctionSpec:
        g = self.geometry(size)
        ref_s = TensorSpec("ref_s", (1, KOKORO.ref_s_dim), "float32", "voice style; [:, :style_dim] is the decoder style")
        if self.layout == "folded":
            f = self.fold(size)
            return FunctionSpec(
                MAIN_FUNCTION,
                inputs=(
                    TensorSpec("x_rows", (f.rows, 512, f.width), "float32", "decoder features (80 Hz), folded"),
                    ref_s,
                    TensorSpec("har_rows", (f.rows, HAR_CHANNELS, f.width * f.upsample + 1), "float32",
                               "the hn-NSF source's STFT magnitude and phase, folded"),
                    TensorSpec("mask_rows", (f.rows, 1, f.width), "float32", "1 for valid 80 Hz frames, folded"),
                ),
                outputs=(TensorSpec("spectrum", (f.rows, HAR_CHANNELS, f.valid * f.upsample), "float32",
                                    "conv_post's log-magnitude and phase channels at the rows' centres"),),
            )
        return FunctionSpec(
            MAIN_FUNCTION,
            inputs=(
                TensorSpec("x_pre", (1, 512, g["f0_frames"]), "float32", "decoder features (80 Hz)"),
                ref_s,
                TensorSpec("har", (1, HAR_CHANNELS, g["har_frames"]), "float32",
                           "STFT magnitude (11) and phase (11) of the hn-NSF source, zero padded"),
                TensorSpec("mask", (1, 1, g["f0_frames"]), "float32", "1 for valid 80 Hz frames, 0 for padding"),
            ),
            outputs=(TensorSpec("waveform", (1, 1, g["samples"]), "float32", "24 kHz audio; trim to frames×600"),),
        )

    def valid_regions(self, inputs) -> dict:
        if self.layout == "folded":
            return {"spectrum": None}  # 0 after the last valid frame in the graph and in the reference
        # mask is at 80 Hz: 300 samples per frame
        return {"waveform": (2, 300 * int(inputs["mask"].sum()))}

    def build(self, model) -> nn.Module:
        if self.layout == "whole":
            return GeneratorModule(model).eval()
        reach = halo_frames(model.decoder.generator)
        if reach > HALO:
            raise ValueError(f"the generator body reaches {reach} frames from a row's edge; the folded layout's "
                             f"halo is {HALO} (kokoro.fold.HALO)")
        return FoldedBody(model).eval()

    def example_inputs(self, model, weights_dir: Path, size: int, reference=None) -> dict[str, np.ndarray]:
        ref = reference if reference is not None else example_for_seconds(model, weights_dir, size, EXAMPLE_VOICE)
        g = self.geometry(size)
        whole = {
            "x_pre": pad_last(ref["x_pre"], g["f0_frames"]),
            "ref_s": ref["ref_s"],
            "har": pad_last(ref["har"], g["har_frames"]),
            "mask": frame_mask(ref["x_pre"].shape[-1], g["f0_frames"]),
        }
        if self.layout == "whole":
            return whole
        f = self.fold(size)
        return {"x_rows": f.fold(whole["x_pre"]), "ref_s": whole["ref_s"],
                "har_rows": f.fold(whole["har"], f.upsample, 1), "mask_rows": f.fold(whole["mask"])}
