"""Kokoro through the listener's gate (:mod:`anetts.listen.gate`): the corpus rendered by upstream
``KModel`` at two seeds and by a build, each sentence in one voice of its language.

Upstream speaks as ``KPipeline`` does: the frontend's chunks at upstream's 510-phoneme limit (the
frontend is upstream's G2P and chunking, tests/test_frontend.py), the voice pack's row for each chunk's
length, ``forward_with_tokens`` with torch's RNG seeded; its two seeds differ only in the noise they
draw. The build speaks as its users hear it: ``synthesize(text, voice)``, its own chunks and draws.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from anetts.listen import gate as G
from anetts.listen.corpus import Sentence, sentences
from anetts.listen.metrics import Features, features
from anetts.listen.toolkit import Listener
from anetts.models.kokoro.dsp import SAMPLE_RATE

log = logging.getLogger(__name__)

WHISPER_LANGUAGE = {"en": "en", "ja": "ja"}  # the corpus's language -> Whisper's code
UPSTREAM_PHONEMES = 510  # KPipeline's chunk limit


@dataclass
class Rendered:
    """One sentence in one voice: its audio per side and, once heard, its features."""

    sentence: Sentence
    voice: str
    audio: dict[str, np.ndarray] = field(default_factory=dict)  # reference, floor, candidate
    heard: dict[str, Features] = field(default_factory=dict)


class Upstream:
    """Upstream ``KModel`` on a weights directory (config.json, kokoro-v1_0.pth, voices/<name>.pt)."""

    def __init__(self, weights_dir: Path):
        from anetts.models.kokoro.weights import load_kmodel, read_config

        self.weights_dir = Path(weights_dir)
        self.kmodel = load_kmodel(self.weights_dir)
        self.vocab = dict(read_config(self.weights_dir)["vocab"])
        self._packs: dict[str, np.ndarray] = {}

    def pack(self, voice: str) -> np.ndarray:
        from anetts.models.kokoro.weights import load_voice

        if voice not in self._packs:
            self._packs[voice] = load_voice(self.weights_dir, voice).float().numpy().reshape(510, -1)
        return self._packs[voice]

    def speak(self, text: str, voice: str, seed: int) -> np.ndarray:
        import torch

        from anetts.models.kokoro.frontend import frontend
        from anetts.models.kokoro.text import tokenize

        pack = self.pack(voice)
        torch.manual_seed(seed)
        out = []
        with torch.inference_mode():
            for chunk in frontend(None, voice).chunks(text, UPSTREAM_PHONEMES):
                ids, _ = tokenize(chunk.phonemes, self.vocab)
                ref_s = pack[min(len(chunk.phonemes), 510) - 1][None]  # KPipeline's voice[len(ps) - 1]
                audio, _ = self.kmodel.forward_with_tokens(torch.tensor([[0, *ids, 0]]), torch.from_numpy(ref_s), 1.0)
                out.append(audio.numpy().reshape(-1))
        return np.concatenate(out).astype(np.float32)


def corpus(voices: dict[str, list[str]], limit: int | None = None) -> list[Rendered]:
    """Every sentence of each language's corpus, voices taken in turn by the sentence's line, so a
    sentence has the same voice whatever ``limit`` keeps."""
    out = []
    for language, names in voices.items():
        if not names:
            raise ValueError(f"listen.voices.{language}: no voices")
        for s in sentences(language, limit):
            out.append(Rendered(s, names[s.index % len(names)]))
    return out


def render_upstream(items: list[Rendered], upstream: Upstream, seeds: tuple[int, int]) -> None:
    for item in items:
        for side, seed in zip(("reference", "floor"), seeds):
            item.audio[side] = upstream.speak(item.sentence.text, item.voice, seed)


def render_build(items: list[Rendered], tts) -> float:
    """The build's audio for every item, as ``synthesize`` gives it; returns the seconds it took."""
    t0 = time.perf_counter()
    for n, item in enumerate(items, 1):
        item.audio["candidate"] = np.asarray(tts.synthesize(item.sentence.text, voice=item.voice).audio, np.float32)
        log.info("build spoke %d/%d (%s %d) in %.0f s", n, len(items), item.sentence.language, item.sentence.index,
                 time.perf_counter() - t0)
    return time.perf_counter() - t0


def hear(items: list[Rendered], listener: Listener, sides=("reference", "floor", "candidate")) -> float:
    """Features of each item's audio on ``sides`` (those not heard yet); returns the seconds it took."""
    t0 = time.perf_counter()
    for item in items:
        for side in sides:
            if side not in item.heard:
                item.heard[side] = features(listener, item.audio[side], SAMPLE_RATE,
                                            WHISPER_LANGUAGE[item.sentence.language])
    return time.perf_counter() - t0


def verdict(items: list[Rendered], margins: G.Margins) -> dict:
    clips: dict[str, list[dict]] = {}
    for item in items:
        clips.setdefault(item.sentence.language, []).append({
            "sentence": {"index": item.sentence.index, "set": item.sentence.set, "text": item.sentence.text,
                         "voice": item.voice},
            **{side: item.heard[side] for side in ("reference", "floor", "candidate")}})
    return G.judge(clips, margins)


def write_worst_clips(items: list[Rendered], report: dict, out_dir: Path) -> None:
    """The reference and candidate audio of each language's worst sentence per metric, as wav files
    in ``out_dir``; each language's ``worst`` entries gain their file names."""
    import soundfile as sf

    out_dir.mkdir(parents=True, exist_ok=True)
    by_key = {(i.sentence.language, i.sentence.index): i for i in items}
    for language, lang in report["languages"].items():
        files = {}
        for metric, row in lang["worst"].items():
            index = lang["rows"][row]["sentence"]["index"]
            names = {}
            for side in ("reference", "candidate"):
                name = f"{language}-{index:03d}-{side}.wav"
                if not (out_dir / name).exists():
                    sf.write(out_dir / name, by_key[(language, index)].audio[side], SAMPLE_RATE, subtype="PCM_16")
                names[side] = name
            files[metric] = {"row": row, "index": index, **names}
        lang["worst"] = files


def check_listen(tts, weights_dir: Path, settings: dict, clips_dir: Path, listener: Listener | None = None) -> dict:
    """The gate's verdict on ``tts`` (a build's runtime) against upstream on ``weights_dir``'s weights.

    ``settings``: ``voices`` {language: [voice, ...]}, ``margins`` (:class:`anetts.listen.gate.Margins`),
    ``seeds`` (upstream's two; default [0, 1]), ``limit`` (sentences per corpus set; default all)."""
    margins = G.Margins.from_config(dict(settings["margins"]))
    seeds = tuple(settings.get("seeds") or (0, 1))
    if len(seeds) != 2 or seeds[0] == seeds[1]:
        raise ValueError(f"listen.seeds: two different seeds, got {list(seeds)}")
    missing = sorted({v for vs in settings["voices"].values() for v in vs} - set(tts.voices))
    if missing:
        raise ValueError(f"listen.voices: {missing} are not voices of this build; it has {tts.voices}")
    listener = listener or Listener()
    items = corpus(dict(settings["voices"]), settings.get("limit"))
    t0 = time.perf_counter()
    render_upstream(items, Upstream(weights_dir), seeds)
    upstream_s = time.perf_counter() - t0
    build_s = render_build(items, tts)
    hear_s = hear(items, listener)
    report = verdict(items, margins)
    write_worst_clips(items, report, Path(clips_dir))
    audio_s = sum(item.audio["candidate"].size for item in items) / SAMPLE_RATE
    report.update(backend=tts.backend.name, seeds=list(seeds), voices=dict(settings["voices"]),
                  seconds={"audio": audio_s, "upstream": upstream_s, "build": build_s, "listen": hear_s,
                           "listen_per_audio_second": hear_s / (3 * audio_s)})
    return report
