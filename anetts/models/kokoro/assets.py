"""What the Kokoro runtime needs besides the packages: the phoneme vocab and the voice packs.

Written next to the packages and listed (with sha256) in the manifest, so a built model directory
is all the runtime needs; the build's checkpoint can be deleted or never shipped.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from anetts.models.kokoro.dsp import KOKORO

VOCAB_FILE = "vocab.json"
VOICES_DIR = "voices"
VOICE_ROWS, STYLE_DIM = KOKORO.voice_rows, KOKORO.ref_s_dim  # upstream packs are (510, 1, 256); stored (510, 256)


def write_runtime_assets(weights_dir: Path, out_dir: Path) -> list[str]:
    """vocab.json ({symbol: id}) and voices/<name>.npy ((510, 256) float32); returns the relative paths."""
    # the build's checkpoint reader (torch): imported here, so the runtime's names above stay torch-free
    from anetts.models.kokoro.weights import list_voices, read_config, validate_voice

    weights_dir, out_dir = Path(weights_dir), Path(out_dir)
    config = read_config(weights_dir)
    (out_dir / VOICES_DIR).mkdir(parents=True, exist_ok=True)
    (out_dir / VOCAB_FILE).write_text(json.dumps(config["vocab"], ensure_ascii=False, indent=0), encoding="utf-8")
    written = [VOCAB_FILE]
    for name in list_voices(weights_dir):
        pack = validate_voice(weights_dir / "voices" / f"{name}.pt").float().numpy().reshape(VOICE_ROWS, STYLE_DIM)
        np.save(out_dir / VOICES_DIR / f"{name}.npy", pack.astype(np.float32))
        written.append(f"{VOICES_DIR}/{name}.npy")
    return written
