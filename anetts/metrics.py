"""Agreement metrics between a reference tensor and a candidate, on the valid region only.

SNR = 10·log10(Σref² / Σ(ref−x)²); PSNR = 20·log10(max|ref| / RMSE) as in apple/ml-stable-diffusion
and argmaxtools. Identical tensors give +inf dB (reported as a large finite number in JSON).
"""
from __future__ import annotations

import math

import numpy as np

# JSON has no inf; a perfect match is reported as this many dB
PERFECT_DB = 200.0


def _db(ratio: float) -> float:
    if ratio <= 0:
        return -PERFECT_DB
    return min(PERFECT_DB, 10.0 * math.log10(ratio)) if math.isfinite(ratio) else PERFECT_DB


def compare(reference: np.ndarray, candidate: np.ndarray) -> dict:
    ref = np.asarray(reference, dtype=np.float64).ravel()
    x = np.asarray(candidate, dtype=np.float64).ravel()
    if ref.shape != x.shape:
        raise ValueError(f"shape mismatch: reference {reference.shape} vs candidate {candidate.shape}")
    finite = bool(np.isfinite(x).all())
    if not finite:
        return {"snr_db": -PERFECT_DB, "psnr_db": -PERFECT_DB, "max_abs": float("inf"), "cosine": 0.0,
                "pearson": 0.0, "finite": False, "n": int(ref.size)}
    err = ref - x
    sig, noise = float(np.sum(ref**2)), float(np.sum(err**2))
    mse = noise / max(ref.size, 1)
    peak = float(np.max(np.abs(ref))) if ref.size else 0.0
    snr = _db(sig / noise) if noise > 0 else PERFECT_DB
    psnr = _db(peak**2 / mse) if mse > 0 else PERFECT_DB
    nr, nx = np.linalg.norm(ref), np.linalg.norm(x)
    cosine = float(ref @ x / (nr * nx)) if nr > 0 and nx > 0 else float(nr == nx)
    rc, xc = ref - ref.mean(), x - x.mean()
    den = np.linalg.norm(rc) * np.linalg.norm(xc)
    pearson = float(rc @ xc / den) if den > 0 else float(np.allclose(rc, xc))
    return {"snr_db": round(snr, 3), "psnr_db": round(psnr, 3), "max_abs": float(np.max(np.abs(err))) if err.size else 0.0,
            "cosine": cosine, "pearson": pearson, "finite": True, "n": int(ref.size)}


def exact_match_fraction(reference: np.ndarray, candidate: np.ndarray) -> float:
    ref, x = np.asarray(reference).ravel(), np.asarray(candidate).ravel()
    return float(np.mean(ref == x)) if ref.size else 1.0


def logit_rows(calls) -> np.ndarray:
    """Every call's logits as rows over their last axis, stacked (a call may hold several rows: one per pass)."""
    return np.concatenate([np.asarray(c).reshape(-1, np.asarray(c).shape[-1]) for c in calls])


def top1_agreement(reference: np.ndarray, candidate: np.ndarray, axis: int = -1) -> float:
    """Fraction of rows (all axes but `axis`) whose argmax over `axis` is the same (logits)."""
    ref, x = np.asarray(reference), np.asarray(candidate)
    if ref.shape != x.shape:
        raise ValueError(f"shape mismatch: reference {ref.shape} vs candidate {x.shape}")
    if ref.size == 0:
        return 1.0
    return float(np.mean(np.argmax(ref, axis=axis) == np.argmax(x, axis=axis)))


def gap_in_noise(gap: float, reference: np.ndarray, candidate: np.ndarray) -> dict:
    """A flipped pick's logit gap against the numerical noise of the step it was made at.

    `gap`: the reference's logit of its own pick minus its logit of the candidate's pick (>= 0 when
    the candidate flipped a pick); `reference`, `candidate`: the two logit vectors of that one step.
    The noise is the RMS of their difference over the whole vector. A flip whose gap is a few noise
    units is a near-tie that noise of this size flips; a gap of many noise units is not explained by
    it. (Any flip's two logits must have moved apart by at least the gap, so the gap is judged
    against the step's noise as a whole, not against those two errors.)"""
    d = np.asarray(candidate, np.float64).ravel() - np.asarray(reference, np.float64).ravel()
    noise = float(np.sqrt(np.mean(d * d))) if d.size else 0.0
    ratio = gap / noise if noise > 0 else (0.0 if gap <= 0 else None)  # None: a flip with no noise at all
    return {"logit_noise": noise, "gap_in_noise": ratio}
