"""Stage `codec`: codes of F frames -> 44.1 kHz audio, upstream's modded DAC decoder, bucketed by frames.

I/O (the runtime codes against it): `codes` int32 (1, 10, F), row 0 the semantic code, rows 1..9
the residual codebooks, frames after the valid ones zero; `audio` float32 (1, 2048·F). The decoder
is causal end to end (causal convolutions, transposed convolutions trimmed on the right, per-frame
norms, a causal windowed attention), so samples [0, 2048·valid) do not depend on the padding and
the stage needs no length input (tests/fish/test_codec.py checks it, eager and compiled).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from anetts.models.fish import codec as C
from anetts.models.fish.family import DECLARATION
from anetts.stage import OneCallStage
from anetts.tensors import MAIN_FUNCTION, FunctionSpec, TensorSpec

CODES_PER_FRAME = C.N_CODEBOOKS


def example_codes(cfg: dict, frames: int, valid: int, seed: int = 0) -> np.ndarray:
    """(10, frames) int32: `valid` frames of uniform codes in each codebook's range, then zeros."""
    q = cfg["quantizer"]
    g = np.random.default_rng(seed)
    codes = np.zeros((CODES_PER_FRAME, frames), np.int32)
    codes[0, :valid] = g.integers(0, q["semantic_codebook_size"], valid)
    codes[1:, :valid] = g.integers(0, q["codebook_size"], (CODES_PER_FRAME - 1, valid))
    return codes


def example_valid(frames: int) -> int:
    """Valid frames of a bucket's example: three quarters, so padding is exercised."""
    return max(1, frames - max(1, frames // 4))


class CodecStage(OneCallStage):
    name = "codec"
    description = "modded DAC decoder: 10 codes per frame -> 2048 samples at 44.1 kHz"

    @property
    def decl(self):
        return DECLARATION.stage(self.name)

    def bucket_name(self, size: int) -> str:
        return self.decl.bucket_name(size)

    def geometry(self, size: int) -> dict[str, int]:
        return {"frames": size, "samples": C.SAMPLES_PER_FRAME * size, "samples_per_frame": C.SAMPLES_PER_FRAME,
                "sample_rate": C.SAMPLE_RATE, "codes_per_frame": CODES_PER_FRAME}

    def function(self, size: int) -> FunctionSpec:
        if size < 1:
            raise ValueError(f"codec: bucket of {size} frames; a bucket holds >= 1 frame")
        n = C.SAMPLES_PER_FRAME * size
        return FunctionSpec(
            MAIN_FUNCTION,
            inputs=(TensorSpec("codes", (1, CODES_PER_FRAME, size), "int32",
                               "row 0 semantic code, rows 1..9 residual codes; frames after the valid ones 0"),),
            outputs=(TensorSpec("audio", (1, n), "float32",
                                "44.1 kHz audio; samples [0, 2048·valid frames) are the valid ones"),),
        )

    def load(self, weights_dir: Path, size: int):
        return C.load_codec(weights_dir)

    def build(self, model) -> torch.nn.Module:
        return C.CodecDecoder(model).eval()

    def example_inputs(self, model, weights_dir: Path, size: int, reference=None) -> dict[str, np.ndarray]:
        return {"codes": example_codes(model.codec_config, size, example_valid(size))[None]}

    def valid_regions(self, inputs) -> dict:
        """Trailing all-zero frames are padding (a real all-zero last frame is scored as padding too)."""
        codes = inputs["codes"][0]
        nonzero = np.flatnonzero(codes.any(axis=0))
        valid = int(nonzero[-1]) + 1 if nonzero.size else codes.shape[-1]
        return {"audio": (1, C.SAMPLES_PER_FRAME * valid)}
