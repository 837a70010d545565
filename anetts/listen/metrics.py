"""What a listener notices in a clip, and how two clips of one sentence differ by it.

A clip's features (:func:`features`): its transcript (Whisper base), a speaker embedding (Resemblyzer),
two MOS predictions (DistillMOS, DNSMOS P.808), its pitch track and voicing (pyin, C2..C6, 10 ms hop)
and its log-mel spectrogram. Two clips compared (:func:`compare`): transcript edits (words; Japanese:
the characters of its reading; Chinese: characters), speaker cosine, MOS differences, pitch error in cents over the frames both voice,
voicing disagreement, and the mean log-mel distance.
"""
from __future__ import annotations

import functools
import threading
import unicodedata
from dataclasses import dataclass

import numpy as np

from anetts.listen.toolkit import Listener, require
from anetts.runtime.audio import log_mel

SR_16K = 16000  # what Whisper, DistillMOS and DNSMOS take
PYIN_FMIN, PYIN_FMAX = 65.4, 1046.5  # C2..C6: below C2 pyin locks onto spurious 50 Hz tracks
CHARACTER_LANGUAGES = ("ja", "zh")  # scored by characters: their words are not spaced


@dataclass
class Features:
    text: str
    embedding: np.ndarray  # (256,), unit length
    distillmos: float
    dnsmos_p808: float
    f0: np.ndarray  # Hz per 10 ms frame, NaN where unvoiced
    voiced: np.ndarray  # bool per frame
    log_mel: np.ndarray  # (80, frames)
    seconds: float


def to_16k(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    require("soxr")
    import soxr

    a = np.asarray(audio, np.float32).reshape(-1)
    return a if sample_rate == SR_16K else soxr.resample(a, sample_rate, SR_16K, quality="HQ").astype(np.float32)


def transcript(listener: Listener, a16: np.ndarray, language: str) -> str:
    segments, _ = listener.whisper().transcribe(a16, language=language, beam_size=5, temperature=0.0, vad_filter=False,
                                                condition_on_previous_text=False)
    return " ".join(s.text.strip() for s in segments).strip()


def pitch(audio: np.ndarray, sample_rate: int) -> tuple[np.ndarray, np.ndarray]:
    require("librosa")
    import librosa

    f0, voiced, _ = librosa.pyin(np.asarray(audio, np.float32), sr=sample_rate, fmin=PYIN_FMIN, fmax=PYIN_FMAX,
                                 frame_length=2048, hop_length=sample_rate // 100)
    return f0, np.asarray(voiced, bool)


def features(listener: Listener, audio: np.ndarray, sample_rate: int, language: str) -> Features:
    import torch

    require("resemblyzer")
    from resemblyzer import preprocess_wav

    audio = np.asarray(audio, np.float32).reshape(-1)
    a16 = to_16k(audio, sample_rate)
    embedding = listener.speaker().embed_utterance(preprocess_wav(audio, source_sr=sample_rate))
    with torch.no_grad():
        dmos = float(listener.distillmos()(torch.from_numpy(a16)[None]).reshape(-1)[0])
    p808 = float(listener.dnsmos().run(np.clip(a16, -1.0, 1.0), SR_16K)["p808_mos"])
    f0, voiced = pitch(audio, sample_rate)
    return Features(transcript(listener, a16, language), np.asarray(embedding, np.float32), dmos, p808, f0, voiced,
                    log_mel(audio, sample_rate), audio.size / sample_rate)


_HIRAGANA = {c: c + 0x60 for c in range(0x3041, 0x3097)}  # hiragana -> katakana, one code point apart
_TAGGER_LOCK = threading.Lock()  # a MeCab tagger is not safe across threads


@functools.cache
def _tagger():
    from fugashi import Tagger

    return Tagger()


def reading(text: str) -> str:
    """Japanese as it is pronounced, in katakana (unidic's ``pron`` per word; its ``kana``, else the word
    itself, where a word has none): Whisper writes one sound as 京都 or きょうと, 玉子 or 卵, and a
    listener hears no difference. The tagger is fugashi's default over unidic-lite, the one Kokoro's
    Japanese G2P reads with (misaki's cutlet)."""
    require("fugashi", "unidic_lite")
    with _TAGGER_LOCK:  # made and used under it
        words = [(w.surface, w.feature.pron, w.feature.kana) for w in _tagger()(text)]
    return "".join(next((r for r in (pron, kana) if r and r != "*"), surface)
                   for surface, pron, kana in words).translate(_HIRAGANA)


def tokens(text: str, language: str) -> list[str]:
    """Words (or, for Japanese and Chinese, characters; Japanese by its reading) of a transcript, without
    case or punctuation."""
    text = unicodedata.normalize("NFKC", text).lower()
    if language == "ja":
        text = reading(text)
    text = "".join(" " if unicodedata.category(ch).startswith(("P", "S")) else ch for ch in text)
    if language in CHARACTER_LANGUAGES:
        return [ch for ch in text if not ch.isspace()]
    return text.split()


def edits(reference: list[str], hypothesis: list[str]) -> int:
    """Levenshtein distance between two token lists."""
    row = list(range(len(hypothesis) + 1))
    for i, r in enumerate(reference, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hypothesis, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


def compare(reference: Features, candidate: Features, language: str) -> dict:
    """How ``candidate`` differs from ``reference`` (two renderings of one sentence)."""
    ref_tokens = tokens(reference.text, language)
    n = min(reference.f0.size, candidate.f0.size)
    both = reference.voiced[:n] & candidate.voiced[:n]
    cents = 1200 * np.log2(candidate.f0[:n][both] / reference.f0[:n][both]) if both.any() else np.zeros(0)
    frames = min(reference.log_mel.shape[1], candidate.log_mel.shape[1])
    return {
        "transcript": candidate.text,
        "token_edits": edits(ref_tokens, tokens(candidate.text, language)),
        "tokens": len(ref_tokens),
        "speaker_cosine": float(np.dot(reference.embedding, candidate.embedding)),
        "distillmos_delta": candidate.distillmos - reference.distillmos,
        "dnsmos_p808_delta": candidate.dnsmos_p808 - reference.dnsmos_p808,
        "pitch_cents_rmse": float(np.sqrt(np.mean(cents ** 2))) if cents.size else 0.0,
        "voicing_disagreement": float(np.mean(reference.voiced[:n] != candidate.voiced[:n])) if n else 0.0,
        "log_mel_l1": float(np.mean(np.abs(reference.log_mel[:, :frames] - candidate.log_mel[:, :frames]))),
        "seconds": candidate.seconds,
    }
