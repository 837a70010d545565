"""Stage `f0ntrain`: aligned prosody features → F0 and noise curves at 80 Hz.

Upstream modules: predictor.shared (BiLSTM), predictor.F0 / predictor.N (AdainResBlk1d ×3, the
middle one upsamples 2×), F0_proj, N_proj.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from torch import nn

from anetts.models.kokoro import masked
from anetts.models.kokoro.reference import example_for_seconds
from anetts.models.kokoro.dsp import KOKORO, frame_mask, pad_last
from anetts.models.kokoro.stages.base import EXAMPLE_VOICE, KokoroStage
from anetts.tensors import MAIN_FUNCTION, FunctionSpec, TensorSpec


class F0NModule(nn.Module):
    def __init__(self, model):
        super().__init__()
        p = model.predictor
        self.shared = masked.MaskedBiLSTM(p.shared)
        self.F0, self.N, self.F0_proj, self.N_proj = p.F0, p.N, p.F0_proj, p.N_proj

    def _branch(self, x, s, m, blocks, proj):
        for block in blocks:
            x, m = masked.adain_resblk(block, x, s, m)
        return (proj(x) * m).squeeze(1)

    def forward(self, en, s, mask):
        x = self.shared((en * mask).transpose(1, 2), mask.transpose(1, 2)).transpose(1, 2)
        return self._branch(x, s, mask, self.F0, self.F0_proj), self._branch(x, s, mask, self.N, self.N_proj)


class F0NtrainStage(KokoroStage):
    name = "f0ntrain"
    components = ("predictor",)
    description = "Kokoro F0 and noise predictor"

    def function(self, size: int) -> FunctionSpec:
        g = self.geometry(size)
        f, f2 = g["frames"], g["f0_frames"]
        return FunctionSpec(
            MAIN_FUNCTION,
            inputs=(
                TensorSpec("en", (1, 640, f), "float32", "prosody features d aligned to frames (40 Hz)"),
                TensorSpec("s", (1, KOKORO.style_dim), "float32", "prosody style"),
                TensorSpec("mask", (1, 1, f), "float32", "1 for valid frames, 0 for padding"),
            ),
            outputs=(
                TensorSpec("F0_pred", (1, f2), "float32", "F0 curve in Hz at 80 Hz, 0 on padding"),
                TensorSpec("N_pred", (1, f2), "float32", "noise curve at 80 Hz, 0 on padding"),
            ),
        )

    def valid_regions(self, inputs) -> dict:
        f2 = 2 * int(inputs["mask"].sum())
        return {"F0_pred": (1, f2), "N_pred": (1, f2)}

    def build(self, model) -> nn.Module:
        return F0NModule(model).eval()

    def example_inputs(self, model, weights_dir: Path, size: int, reference=None) -> dict[str, np.ndarray]:
        ref = reference if reference is not None else example_for_seconds(model, weights_dir, size, EXAMPLE_VOICE)
        frames = self.geometry(size)["frames"]
        return {
            "en": pad_last(ref["en"], frames),
            "s": ref["s"],
            "mask": frame_mask(ref["en"].shape[-1], frames),
        }
