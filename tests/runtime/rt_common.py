"""Shared constants and helpers of the runtime tests (imported as a top-level module by pytest)."""
from __future__ import annotations

import shutil
from pathlib import Path

# Short utterances that fit t32 (<= 30 phonemes) and 3 s (120 frames) on the tiny model.
SHORT = "həlˈO wˈɜːld."
MEDIUM = "ðɪs ɪz ɐ tˈɛst ʌv ðə ɹˈʌntˌIm."


def copy_model_dir(src: Path, dest: Path) -> Path:
    """What the runtime reads of a model dir: manifest, packages, exports and runtime assets.

    The build's weights are left behind: the runtime must not need the checkpoint."""
    skip = shutil.ignore_patterns("logs", "benchmarks", "reference", "*.scenario.npz")

    def ignore(folder, names):  # the top-level weights/ only: packages hold a weights/ folder too
        return set(skip(folder, names)) | ({"weights"} if Path(folder) == Path(src) else set())

    shutil.copytree(src, dest, ignore=ignore)
    return dest
