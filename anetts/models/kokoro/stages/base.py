"""What every Kokoro stage shares: bucket naming, geometry, voice choice for examples."""
from __future__ import annotations

from pathlib import Path

from anetts.models.kokoro.dsp import KOKORO
from anetts.stage import Stage

EXAMPLE_VOICE = "af_heart"  # falls back to the first voice present (synthetic packs are syn_*)

_THIS_DIR = Path(__file__).parent
_KOKORO_DIR = _THIS_DIR.parent


def seconds_geometry(seconds: int) -> dict[str, int]:
    # one geometry for build and runtime: dsp.KOKORO (kokoro.md §4)
    return {
        "seconds": seconds,
        "frames": KOKORO.frames(seconds),  # alignment frames (asr, en, mask)
        "f0_frames": KOKORO.f0_frames(seconds),  # F0, N, x_pre
        "har_frames": KOKORO.har_len(seconds),  # STFT frames of the source at hop 5, centred
        "samples": KOKORO.samples(seconds),
    }


class KokoroStage(Stage):
    """A Kokoro stage bucketed either by tokens (`t128`) or by seconds of audio (`10s`)."""

    bucket_unit = "seconds"  # or "tokens"
    module_file: Path

    def bucket_name(self, size: int) -> str:
        return f"t{size}" if self.bucket_unit == "tokens" else f"{size}s"

    def geometry(self, size: int) -> dict[str, int]:
        return {"tokens": size} if self.bucket_unit == "tokens" else seconds_geometry(size)

    def source_files(self) -> list[Path]:
        files = [self.module_file, _THIS_DIR / "base.py", _KOKORO_DIR / "masked.py", _KOKORO_DIR / "dsp.py"]
        # stages that build their own examples (not from the shared reference run) use reference.py
        return files if self.uses_reference else files + [_KOKORO_DIR / "reference.py"]
