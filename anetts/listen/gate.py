"""A listener's gate: a candidate's clips against upstream's, beside upstream against itself.

For every sentence there are three renderings: upstream at seed A (the reference), upstream at seed B
(the floor: what another noise draw of the same model changes), and the candidate (a build). Each
metric is summarized per language over its clips, once for the candidate and once for the floor, both
measured against the reference; the metric holds when the candidate lies within the floor plus a
margin, in the direction that is worse for a listener:

| metric | summary | holds when |
|---|---|---|
| ``token_error_rate`` | transcript edits against upstream's own transcript / its tokens | candidate <= floor + margin |
| ``speaker_cosine_mean``, ``speaker_cosine_min`` | Resemblyzer cosine to the reference clip | candidate >= floor - margin |
| ``distillmos_delta``, ``dnsmos_p808_delta`` | mean MOS change from the reference | candidate >= floor - margin |
| ``pitch_cents`` | mean pyin cents RMSE over frames both clips voice | candidate <= floor + margin |
| ``voicing_disagreement`` | mean share of frames voiced in one clip only | candidate <= floor + margin |
| ``log_mel_l1`` | mean log-mel distance | candidate <= floor + margin |

Transcripts are compared with upstream's transcript, not with the text: a listener hears what upstream
says, and Whisper's spelling of numbers is not the TTS's fault; Japanese compares by reading (kanji or kana alike).
Waveform SNR is not here: two draws of upstream score 20-23 dB against each other.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from anetts.listen.metrics import compare

# metric -> (direction, what one sentence contributes): +1 larger is worse, -1 smaller is worse
METRICS = {
    "token_error_rate": +1,
    "speaker_cosine_mean": -1,
    "speaker_cosine_min": -1,
    "distillmos_delta": -1,
    "dnsmos_p808_delta": -1,
    "pitch_cents": +1,
    "voicing_disagreement": +1,
    "log_mel_l1": +1,
}
# the per-clip measure each metric is worst on (for the report's "worst sentence")
_PER_CLIP = {"token_error_rate": "token_edits", "speaker_cosine_mean": "speaker_cosine",
             "speaker_cosine_min": "speaker_cosine", "distillmos_delta": "distillmos_delta",
             "dnsmos_p808_delta": "dnsmos_p808_delta", "pitch_cents": "pitch_cents_rmse",
             "voicing_disagreement": "voicing_disagreement", "log_mel_l1": "log_mel_l1"}


class GateConfigError(ValueError):
    """Margins that name an unknown metric or are not non-negative numbers."""


@dataclass(frozen=True)
class Margins:
    values: dict[str, float]

    @classmethod
    def from_config(cls, margins: dict) -> "Margins":
        unknown = sorted(set(margins) - set(METRICS))
        if unknown:
            raise GateConfigError(f"listen.margins: unknown metric(s) {unknown}; known: {list(METRICS)}")
        missing = sorted(set(METRICS) - set(margins))
        if missing:
            raise GateConfigError(f"listen.margins: no margin for {missing}")
        bad = {k: v for k, v in margins.items() if not isinstance(v, (int, float)) or v < 0}
        if bad:
            raise GateConfigError(f"listen.margins: margins must be numbers >= 0, got {bad}")
        return cls({k: float(v) for k, v in margins.items()})


def summarize(rows: list[dict]) -> dict[str, float]:
    """One language's metrics from its per-clip comparisons (:func:`anetts.listen.metrics.compare`)."""
    tokens = sum(r["tokens"] for r in rows)
    cos = [r["speaker_cosine"] for r in rows]
    return {
        "token_error_rate": sum(r["token_edits"] for r in rows) / max(tokens, 1),
        "speaker_cosine_mean": float(np.mean(cos)),
        "speaker_cosine_min": float(np.min(cos)),
        "distillmos_delta": float(np.mean([r["distillmos_delta"] for r in rows])),
        "dnsmos_p808_delta": float(np.mean([r["dnsmos_p808_delta"] for r in rows])),
        "pitch_cents": float(np.mean([r["pitch_cents_rmse"] for r in rows])),
        "voicing_disagreement": float(np.mean([r["voicing_disagreement"] for r in rows])),
        "log_mel_l1": float(np.mean([r["log_mel_l1"] for r in rows])),
    }


def check(candidate: dict[str, float], floor: dict[str, float], margins: Margins) -> dict[str, dict]:
    """Per metric: the candidate, the floor, the limit and whether the candidate is within it."""
    out = {}
    for name, direction in METRICS.items():
        m = margins.values[name]
        limit = floor[name] + m if direction > 0 else floor[name] - m
        ok = candidate[name] <= limit if direction > 0 else candidate[name] >= limit
        out[name] = {"candidate": candidate[name], "floor": floor[name], "margin": m, "limit": limit, "passed": bool(ok)}
    return out


def _worst(rows: list[dict], metric: str) -> int:
    key = _PER_CLIP[metric]
    values = [r["candidate"][key] for r in rows]
    return int(np.argmax(values) if METRICS[metric] > 0 else np.argmin(values))


def judge(clips: dict[str, list[dict]], margins: Margins) -> dict:
    """The verdict over ``clips``: {language: [{"sentence", "reference", "floor", "candidate"} ...]} where
    the last three are each clip's :class:`~anetts.listen.metrics.Features`."""
    languages = {}
    for language, items in clips.items():
        rows = []
        for item in items:
            rows.append({
                "sentence": item["sentence"],
                "reference_transcript": item["reference"].text,
                "floor": compare(item["reference"], item["floor"], language),
                "candidate": compare(item["reference"], item["candidate"], language),
            })
        cand = summarize([r["candidate"] for r in rows])
        floor = summarize([r["floor"] for r in rows])
        checks = check(cand, floor, margins)
        languages[language] = {
            "clips": len(rows), "seconds": float(sum(r["candidate"]["seconds"] for r in rows)),
            "passed": all(c["passed"] for c in checks.values()),
            "failed": [k for k, c in checks.items() if not c["passed"]],
            "checks": checks,
            "worst": {k: _worst(rows, k) for k in METRICS},
            "rows": rows,
        }
    failed = [f"{lang}: {k}" for lang, v in languages.items() for k in v["failed"]]
    return {"passed": not failed, "failed": failed, "margins": margins.values, "languages": languages}
