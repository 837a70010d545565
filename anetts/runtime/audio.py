"""Audio helpers for checks and reports: log-mel spectrograms and their comparison, join continuity.

Two syntheses of the same utterance with different hn-NSF noise draws differ sample by sample,
so waveform correlation says nothing; the log-mel spectrogram is what should agree.
"""
from __future__ import annotations

import functools

import numpy as np


def _hz_to_mel(f):
    return 2595.0 * np.log10(1.0 + np.asarray(f, dtype=np.float64) / 700.0)


def _mel_to_hz(m):
    return 700.0 * (10.0 ** (np.asarray(m, dtype=np.float64) / 2595.0) - 1.0)


@functools.lru_cache(maxsize=8)
def mel_filterbank(sample_rate: int, n_fft: int = 1024, n_mels: int = 80,
                   fmin: float = 0.0, fmax: float | None = None) -> np.ndarray:
    """(n_mels, n_fft // 2 + 1) triangular HTK-mel filters, area-normalised (Slaney style)."""
    fmax = sample_rate / 2 if fmax is None else fmax
    freqs = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    up = (freqs[None] - lo) / (mid - lo)
    down = (hi - freqs[None]) / (hi - mid)
    fb = np.maximum(0.0, np.minimum(up, down))
    return fb * (2.0 / (hi - lo))


def log_mel(audio: np.ndarray, sample_rate: int, n_fft: int = 1024, hop: int = 256,
            n_mels: int = 80, floor: float = 1e-5) -> np.ndarray:
    """(n_mels, frames) natural-log mel magnitude spectrogram (Hann window, centred, reflect pad)."""
    x = np.asarray(audio, dtype=np.float64).reshape(-1)
    if x.shape[0] < 2:
        raise ValueError("audio too short for a spectrogram")
    pad = n_fft // 2
    x = np.pad(x, pad, mode="reflect" if x.shape[0] > pad else "constant")
    frames = np.lib.stride_tricks.sliding_window_view(x, n_fft)[::hop]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    mag = np.abs(np.fft.rfft(frames * window, axis=1)).T  # (bins, frames)
    return np.log(np.maximum(mel_filterbank(sample_rate, n_fft, n_mels) @ mag, floor))


def log_mel_similarity(a: np.ndarray, b: np.ndarray, sample_rate: int) -> dict:
    """Pearson correlation and mean absolute distance (nats) of two clips' log-mels.

    The clips are cut to the shorter length; ``length_a/b`` report the originals.
    """
    n = min(len(a), len(b))
    ma, mb = log_mel(a[:n], sample_rate), log_mel(b[:n], sample_rate)
    corr = float(np.corrcoef(ma.reshape(-1), mb.reshape(-1))[0, 1])
    return {
        "log_mel_corr": corr,
        "log_mel_l1": float(np.mean(np.abs(ma - mb))),
        "log_mel_rmse": float(np.sqrt(np.mean((ma - mb) ** 2))),
        "length_a": int(len(a)),
        "length_b": int(len(b)),
    }


def join_continuity(audio: np.ndarray, boundaries: list[int], window: int = 2400) -> list[dict]:
    """Per join sample index: |Δ| across the join vs the largest |Δ| in ``window`` samples around it."""
    x = np.asarray(audio, dtype=np.float64).reshape(-1)
    d = np.abs(np.diff(x))
    out = []
    for b in boundaries:
        jump = float(abs(x[b] - x[b - 1]))
        lo, hi = max(0, b - window), min(len(d), b + window)
        around = np.concatenate([d[lo : b - 1], d[b : hi]])
        out.append({"sample": int(b), "jump": jump, "max_local_delta": float(around.max()) if around.size else 0.0})
    return out
