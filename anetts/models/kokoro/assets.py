"""What the Kokoro runtime needs besides the packages: the phoneme vocab, the voice packs and the
language each voice speaks (the G2P its text goes through when the request names no language).

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
VOICE_LANGUAGES_FILE = "voice_languages.json"  # {voice: upstream language letter}
VOICE_ROWS, STYLE_DIM = KOKORO.voice_rows, KOKORO.ref_s_dim  # upstream packs are (510, 1, 256); stored (510, 256)


# The language the synthetic voices (syn_a, syn_b) are spoken in: the synthetic vocab is upstream's,
# and English text is what the tests and examples give them; their names, unlike upstream's, say none.
SYNTHETIC_VOICE_LANGUAGE = "a"


def voice_language(name: str) -> str | None:
    """The language letter a voice's name declares: upstream's first letter (``af_heart`` -> ``a``), or
    the synthetic stand-ins' English; None for a name that declares none."""
    from anetts.models.kokoro.frontend import named_language
    from anetts.models.kokoro.synthetic import SYNTHETIC_VOICES

    return SYNTHETIC_VOICE_LANGUAGE if name in SYNTHETIC_VOICES else named_language(name)


def write_runtime_assets(weights_dir: Path, out_dir: Path) -> list[str]:
    """vocab.json ({symbol: id}), voices/<name>.npy ((510, 256) float32) and voice_languages.json;
    returns the relative paths."""
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
    languages = {name: voice_language(name) for name in list_voices(weights_dir)}
    (out_dir / VOICE_LANGUAGES_FILE).write_text(
        json.dumps({k: v for k, v in languages.items() if v is not None}, indent=0), encoding="utf-8")
    return [*written, VOICE_LANGUAGES_FILE]
