"""The seconds of audio one call of a Kokoro bucket covers (`FamilyDecl.audio_seconds`), for the
manifest's ANE-eligible share (:mod:`anetts.compile.ane_share`).

- a frame bucket (f0ntrain, decoder_pre, generator; geometry `frames`): frames x 600 samples per
  frame / 24,000 Hz, the geometry the host DSP and the runtime use (3 s bucket: 120 frames, 3.0 s);
- a token bucket (duration; geometry `tokens`, the two wrap tokens included): tokens / the runtime's
  chunk-budget estimate `TOKENS_PER_SECOND`, which counts the wrap tokens too
  (`anetts.models.kokoro.text.phoneme_limit`). The estimate is the runtime's lower, safer figure, so
  a token bucket's audio is if anything overstated and the duration stage's MACs per second understated.
"""
from __future__ import annotations

from anetts.models.kokoro.dsp import KOKORO
from anetts.models.kokoro.runtime import TOKENS_PER_SECOND


def audio_seconds(stage: str, geometry: dict) -> float:
    if "frames" in geometry:
        return int(geometry["frames"]) * KOKORO.samples_per_frame / KOKORO.sample_rate
    if "tokens" in geometry:
        return int(geometry["tokens"]) / TOKENS_PER_SECOND
    raise ValueError(f"kokoro stage {stage}: geometry {geometry} has neither frames nor tokens")
