"""The generator's body over a sequence folded into rows: windows with halos, in one program.

The Neural Engine takes no axis wider than 16,384 (the lint's `max_axis`); the generator's body runs
at 4,800 Hz, so a 3 s sequence (14,401 frames) fits and a 30 s one (144,001) does not. Folded, the
sequence becomes `rows` windows of `width` 80 Hz frames: each row's centre (`valid` frames) plus
`halo` frames of its neighbours on either side, so the widest axis is width × 60 + 1 ≤ 16,384 at
any length. Rows are the batch: upstream's convolutions run unchanged over them.

Windows run one by one would not equal the whole: every AdaIN normalizes by its input's statistics
over the whole sequence. Here the rows run in one program and each instance norm takes its
statistics over the rows' centres only (masked.Stats), so every frame is counted once, as upstream
counts it. A convolution at a row's edge reads zeros where the neighbour's frames would be; that
error spreads inwards by the body's receptive field, which the halo is made wider than
(:func:`halo_frames`), so the centres equal the whole run (tests/test_generator_fold.py).

Torch-free: the runtime folds and unfolds here; the stage (stages/generator.py, FoldedBody) runs it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MAX_AXIS = 16_384  # the widest axis the Neural Engine takes (the lint's long_last_axis)
# 80 Hz frames of halo every folded build uses: the reach of Kokoro-82M's body (halo_frames: 12;
# kokoro-tiny's 6). A build whose model reaches farther is refused (GeneratorStage.build).
HALO = 12
UPSAMPLE = 60  # 4,800 Hz body frames per 80 Hz frame (the generator's ×10, ×6)


def _resblock_reach(block) -> int:
    """Frames an AdaINResBlock1 output reads on either side: its dilated convs, then each one's
    undilated partner, in series."""
    return sum((c1.kernel_size[0] - 1) // 2 * c1.dilation[0] + (c2.kernel_size[0] - 1) // 2
               for c1, c2 in zip(block.convs1, block.convs2))


def halo_frames(generator) -> int:
    """80 Hz frames of halo that keep a row's centre exact for upstream's `generator` module: the
    body's reach from a row's edge (zero padding where the neighbour's frames would be), counted at
    4,800 Hz through every convolution, upsampling and the reflection pad, in whole 80 Hz frames."""
    reach = 0  # samples at the current rate a row's edge has corrupted
    per_stage = len(generator.resblocks) // len(generator.ups)
    for i, (up, noise_conv, noise_res) in enumerate(zip(generator.ups, generator.noise_convs, generator.noise_res)):
        reach = reach * up.stride[0] + up.kernel_size[0]  # an output reads ceil(k / stride) inputs each side
        noise = -(-noise_conv.kernel_size[0] // noise_conv.stride[0]) + _resblock_reach(noise_res)
        blocks = generator.resblocks[i * per_stage:(i + 1) * per_stage]
        reach = max(reach, noise) + max(_resblock_reach(b) for b in blocks) + (i == len(generator.ups) - 1)
    reach += (generator.conv_post.kernel_size[0] - 1) // 2
    return -(-reach // math.prod(u.stride[0] for u in generator.ups))


@dataclass(frozen=True)
class FoldGeometry:
    """`rows` rows of `width` 80 Hz frames: `halo`, then `valid` frames of centre, then `halo`."""

    rows: int
    width: int
    halo: int = HALO
    upsample: int = UPSAMPLE

    @classmethod
    def for_frames(cls, frames: int, halo: int = HALO, upsample: int = UPSAMPLE,
                   max_axis: int = MAX_AXIS) -> "FoldGeometry":
        """The fewest rows whose centres cover `frames` 80 Hz frames and the frame the reflection pad
        adds, with the widest axis in bounds; then the narrowest centres that still cover them, so the
        last row carries little padding (the body's work grows with rows × width)."""
        widest = (max_axis - 1) // upsample  # the body's widest axis is width × upsample + 1
        if widest - 2 * halo < 1:
            raise ValueError(f"a halo of {halo} frames leaves no centre in rows of {widest}")
        rows = -(-(frames + 1) // (widest - 2 * halo))
        return cls(rows, -(-(frames + 1) // rows) + 2 * halo, halo, upsample)

    @property
    def valid(self) -> int:
        return self.width - 2 * self.halo

    def starts(self, rate: int) -> np.ndarray:
        """Each row's first frame in the whole sequence, at `rate` frames per 80 Hz frame."""
        return (np.arange(self.rows) * self.valid - self.halo) * rate

    def fold(self, a: np.ndarray, rate: int = 1, extra: int = 0) -> np.ndarray:
        """(1, C, L) → (rows, C, width × rate + extra): each row's window, zero outside the sequence."""
        span = self.width * rate + extra
        idx = self.starts(rate)[:, None] + np.arange(span)[None, :]
        inside = (idx >= 0) & (idx < a.shape[-1])
        rows = a[0][:, np.clip(idx, 0, a.shape[-1] - 1)] * inside[None]  # (C, rows, span)
        return np.ascontiguousarray(rows.transpose(1, 0, 2)).astype(a.dtype, copy=False)

    def unfold(self, rows: np.ndarray, length: int) -> np.ndarray:
        """The body's output centres (rows, C, valid × upsample) → (1, C, length) of the whole."""
        whole = rows.transpose(1, 0, 2).reshape(1, rows.shape[1], -1)
        if whole.shape[-1] < length:
            raise ValueError(f"{self.rows} rows hold {whole.shape[-1]} frames, not {length}")
        return whole[..., :length]
