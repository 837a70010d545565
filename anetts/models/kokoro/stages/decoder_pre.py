"""Stage `decoder_pre`: aligned text features + F0/N → decoder features before the vocoder.

Upstream modules: decoder.F0_conv, N_conv, encode, asr_res, decode ×4 (the last upsamples 2×).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from anetts.models.kokoro import masked
from anetts.models.kokoro.reference import example_for_seconds
from anetts.models.kokoro.dsp import KOKORO, frame_mask, pad_last
from anetts.models.kokoro.stages.base import EXAMPLE_VOICE, KokoroStage
from anetts.tensors import MAIN_FUNCTION, FunctionSpec, TensorSpec


class DecoderPreModule(nn.Module):
    def __init__(self, model):
        super().__init__()
        dec = model.decoder
        self.F0_conv, self.N_conv, self.encode, self.asr_res, self.decode = (
            dec.F0_conv, dec.N_conv, dec.encode, dec.asr_res, dec.decode)

    def forward(self, asr, f0, n_input, ref_s, mask):
        s = ref_s[:, :KOKORO.style_dim]
        m2 = masked.upsample_mask(mask, 2)
        asr = asr * mask
        f0 = self.F0_conv(f0 * m2) * mask
        n = self.N_conv(n_input * m2) * mask
        x, m = masked.adain_resblk(self.encode, torch.cat([asr, f0, n], dim=1), s, mask)
        asr_res = self.asr_res(asr) * mask
        residual = True
        for block in self.decode:
            if residual:
                x = torch.cat([x, asr_res, f0, n], dim=1)
            x, m = masked.adain_resblk(block, x, s, m)
            if block.upsample_type != "none":
                residual = False
        return x * m


class DecoderPreStage(KokoroStage):
    name = "decoder_pre"
    components = ("decoder",)
    description = "Kokoro decoder encode/decode blocks (the ANE candidate)"

    def function(self, size: int) -> FunctionSpec:
        g = self.geometry(size)
        f, f2 = g["frames"], g["f0_frames"]
        return FunctionSpec(
            MAIN_FUNCTION,
            inputs=(
                TensorSpec("asr", (1, 512, f), "float32", "text features t_en aligned to frames (40 Hz)"),
                TensorSpec("f0", (1, 1, f2), "float32", "F0 curve in Hz (80 Hz)"),
                TensorSpec("n_input", (1, 1, f2), "float32", "noise curve (80 Hz)"),
                TensorSpec("ref_s", (1, KOKORO.ref_s_dim), "float32", "voice style; [:, :style_dim] is the decoder style"),
                TensorSpec("mask", (1, 1, f), "float32", "1 for valid frames, 0 for padding"),
            ),
            outputs=(TensorSpec("x_pre", (1, 512, f2), "float32", "decoder features (80 Hz), 0 on padding"),),
        )

    def valid_regions(self, inputs) -> dict:
        return {"x_pre": (2, 2 * int(inputs["mask"].sum()))}

    def build(self, model) -> nn.Module:
        return DecoderPreModule(model).eval()

    def example_inputs(self, model, weights_dir: Path, size: int, reference=None) -> dict[str, np.ndarray]:
        ref = reference if reference is not None else example_for_seconds(model, weights_dir, size, EXAMPLE_VOICE)
        g = self.geometry(size)
        return {
            "asr": pad_last(ref["asr"], g["frames"]),
            "f0": pad_last(ref["F0"][:, None, :], g["f0_frames"]),
            "n_input": pad_last(ref["N"][:, None, :], g["f0_frames"]),
            "ref_s": ref["ref_s"],
            "mask": frame_mask(ref["asr"].shape[-1], g["frames"]),
        }
