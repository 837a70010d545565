"""What every Kokoro stage shares: bucket naming, geometry, voice choice for examples."""
from __future__ import annotations

from pathlib import Path

from anetts.models.kokoro import weights
from anetts.models.kokoro.dsp import KOKORO
from anetts.models.kokoro.family import DECLARATION
from anetts.stage import OneCallStage

EXAMPLE_VOICE = "af_heart"  # falls back to the first voice present (synthetic packs are syn_*)


def seconds_geometry(seconds: int) -> dict[str, int]:
    # one geometry for build and runtime: dsp.KOKORO
    return {
        "seconds": seconds,
        "frames": KOKORO.frames(seconds),  # alignment frames (asr, en, mask)
        "f0_frames": KOKORO.f0_frames(seconds),  # F0, N, x_pre
        "har_frames": KOKORO.har_len(seconds),  # STFT frames of the source at hop 5, centred
        "samples": KOKORO.samples(seconds),
    }


class KokoroStage(OneCallStage):
    """A Kokoro stage bucketed either by tokens (`t128`) or by seconds of audio (`10s`)."""

    # the KModel components `build` wraps, when the stage can be built from them alone (without
    # ALBERT; weights.load_components); None: the whole KModel
    components: tuple[str, ...] | None = None

    @property
    def decl(self):
        return DECLARATION.stage(self.name)

    @property
    def bucket_unit(self) -> str:
        return self.decl.bucket_unit

    def bucket_name(self, size: int) -> str:
        return self.decl.bucket_name(size)

    def geometry(self, size: int) -> dict[str, int]:
        return {"tokens": size} if self.bucket_unit == "tokens" else seconds_geometry(size)

    def load(self, weights_dir: Path, size: int):
        # stages wrapping ALBERT load the whole upstream KModel; the others only the components they
        # wrap (start-up: no transformers for the decoder)
        model = weights.load_kmodel(weights_dir) if self.components is None else \
            weights.load_components(weights_dir, self.components)
        return weights.prepare_for_trace(model)

