"""Fish end to end: the runtime over the compiled packages against upstream greedy generation.

Per text: the runtime's prompt rows for it (`FishRuntime.prompt`, one text chunk), upstream's
greedy generation on them (`reference.reference_decode`, fish-speech 0.1.0 with the S2 adaptation,
fp32, until <|im_end|> or the chunk's frame budget), and the runtime's decode loop on the same rows
picking greedily (`greedy.Greedy`, following upstream's pick where its own differs, so every frame
is compared on upstream's path). Then the audio: the runtime's codec on the codes it generated
against upstream's codec (`codec.upstream_decode`, fp32 eager) on upstream's codes.

Gate (``gate`` keys): ``max_tie_noise``: every pick equals upstream's but at divergences whose
upstream logit gap (upstream's logit of its pick minus its logit of the runtime's) is at most this
many units of that step's logit noise (the RMS difference of the two logit vectors; 0: no
divergence allowed) — fp16 packages flip near-ties, random weights make flat logits where
near-ties are common, and the noise a near-tie is judged by grows with depth (a fixed gap that
fits fish-tiny's few layers does not fit S2 Pro's 36); ``min_logits_db``: the head's and the fast
AR's logits against upstream's at every pick — this bounds that noise, and fails a loop whose
picks still agree but whose logits are wrong (a fast-AR state reset between passes);
``min_slow_hidden_db``: the final-normed slow state's SNR against upstream's at every frame (on
upstream's path, so comparable throughout); ``min_audio_snr_db``: the worst text's audio SNR.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from anetts.bench import peak_rss_bytes
from anetts.models.fish.greedy import Greedy
from anetts.metrics import compare

GATE_KEYS = ("max_tie_noise", "min_logits_db", "min_slow_hidden_db", "min_audio_snr_db")


def upstream_generation(model, tts, text: str, max_frames: int | None, reference_text: str | None) -> dict:
    """The runtime's prompt rows for `text` (one text chunk) and upstream's greedy generation on them."""
    from anetts.models.fish import reference as R

    ref_codes = R.reference_codes(tts.cfg) if reference_text else None
    plans = tts.plan(text, reference_text, ref_codes, max_frames=max_frames)
    if len(plans) != 1:
        raise ValueError(f"end-to-end text {text!r} is {len(plans)} text chunks; give texts of one chunk")
    rows = tts.prompt(plans[0].text, reference_text, ref_codes)
    t0 = time.perf_counter()
    up = R.reference_decode(model, tts.cfg, rows, plans[0].budget, stop_at_end=True)
    keep = ("semantic_tokens", "codes", "slow_logits", "slow_hidden", "fast_logits")  # not the layer states
    return {"text": text, "rows": rows, "budget": plans[0].budget, "seconds": time.perf_counter() - t0,
            **{k: up[k] for k in keep}}


def compare_text(tts, up: dict) -> dict:
    """One row: the runtime's greedy decode of upstream's prompt rows against upstream's generation `up`."""
    cfg = tts.cfg
    picks = Greedy(cfg, tts.row_ids, up, follow=True)
    t0 = time.perf_counter()
    frames = list(tts.iter_codes(up["rows"], len(up["semantic_tokens"]), picks=picks))
    runtime_s = time.perf_counter() - t0
    s = picks.summary()
    codes = np.array([c for _, c in frames], np.int64).reshape(-1, cfg.num_codebooks)
    stopped = bool(len(up["semantic_tokens"]) and up["semantic_tokens"][-1] == cfg.im_end_id)
    return {
        "text": up["text"], "prompt_tokens": int(up["rows"].shape[1]), "budget": up["budget"],
        "frames": len(codes), "upstream_stop": "im_end" if stopped else "max_frames",
        "codes": codes,
        "codes_fed_equal": bool(np.array_equal(codes, up["codes"][: len(codes)])),
        **{k: s[k] for k in ("frames_all_codes_equal", "semantic_equal", "codes_equal", "codes_total",
                             "first_divergence", "divergences", "slow_hidden_min_db", "head_logits_min_db",
                             "fast_logits_min_db", "head_top1", "fast_top1")},
        "max_divergence_gap": max((d["upstream_gap"] for d in s["divergences"]), default=None),
        "max_gap_in_noise": _worst_in_noise(s["divergences"]),
        "audio_snr_db": None,
        "seconds": {"upstream": round(up["seconds"], 2), "runtime": round(runtime_s, 2)},
    }


def compare_audio(tts, codec, row: dict, up_codes: np.ndarray) -> None:
    """The runtime codec's audio of the codes it generated against upstream's codec on upstream's codes."""
    from anetts.models.fish import codec as C

    codes = row.pop("codes")
    if not (tts.has_codec and len(codes)):
        return
    t0 = time.perf_counter()
    audio = tts.decode_audio(codes)
    row["seconds"]["codec"] = round(time.perf_counter() - t0, 2)
    want = C.upstream_decode(codec, up_codes[: len(codes)].T)
    row["audio_snr_db"] = compare(want, audio)["snr_db"] if audio.shape == want.shape else None
    row["audio_samples"] = int(audio.size)


def _worst_in_noise(divergences: list[dict]) -> float | None:
    """The largest gap in noise units (None where there is no divergence; inf for a flip with no noise)."""
    ratios = [d["gap_in_noise"] for d in divergences]
    return max((float("inf") if r is None else r for r in ratios), default=None)


def gate_rows(rows: list[dict], gate: dict) -> dict:
    """The gate's checks over all texts (``gate`` keys: GATE_KEYS)."""
    unknown = sorted(set(gate) - set(GATE_KEYS))
    if unknown:
        raise ValueError(f"end-to-end gate: unknown keys {unknown}; known: {list(GATE_KEYS)}")
    tie = float(gate.get("max_tie_noise") or 0.0)
    checks = {
        "codes_equal": all(r["codes_fed_equal"] and all(d["upstream_gap"] >= 0 and d["gap_in_noise"] is not None
                                                        and d["gap_in_noise"] <= tie for d in r["divergences"])
                           for r in rows),
    }
    if gate.get("min_logits_db") is not None:
        checks["logits_db"] = all(r[k] is not None and r[k] >= gate["min_logits_db"]
                                  for r in rows for k in ("head_logits_min_db", "fast_logits_min_db"))
    if gate.get("min_slow_hidden_db") is not None:
        checks["slow_hidden_db"] = all(r["slow_hidden_min_db"] is not None and r["slow_hidden_min_db"] >= gate["min_slow_hidden_db"]
                                       for r in rows)
    if gate.get("min_audio_snr_db") is not None:
        snrs = [r["audio_snr_db"] for r in rows if r["frames"]]
        checks["audio_snr_db"] = bool(snrs) and all(s is not None and s >= gate["min_audio_snr_db"] for s in snrs)
    return checks


def _return_freed_memory() -> None:
    """Hand the freed upstream model's pages back before the packages load, so the job's peak is the
    larger of the two, not their sum: glibc keeps freed heap pages (of bf16 tensors like S2 Pro's, freed
    after use, about a fifth stayed resident until `malloc_trim` on this project's Linux box)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS): nothing to hand back this way
        pass


def check_end_to_end(tts, weights_dir: Path, params: dict, gate: dict) -> dict:
    """`Family.check_end_to_end` for Fish (params: ``texts``, ``max_frames`` per text, optional
    ``reference_text`` spoken over stand-in reference codes)."""
    from anetts.models.fish import codec as C
    from anetts.models.fish.reference import load_reference_model

    texts = list(params.get("texts") or [])
    if not texts:
        raise ValueError("end-to-end check: no texts (families.fish.end_to_end.texts)")
    unknown = sorted(set(params) - {"texts", "max_frames", "reference_text"})
    if unknown:
        raise ValueError(f"end-to-end check: unknown settings {unknown}; known: texts, max_frames, reference_text")
    # one upstream network at a time beside the runtime's packages (its checkpoint memory-mapped, never held)
    peak_mib = {}  # the process's peak RSS after each phase (monotone: the phase where it rose is the one)
    model, _ = load_reference_model(Path(weights_dir))
    ups = [upstream_generation(model, tts, t, params.get("max_frames"), params.get("reference_text")) for t in texts]
    peak_mib["upstream_generation"] = round(peak_rss_bytes() / 2**20)
    del model
    _return_freed_memory()
    rows = [compare_text(tts, up) for up in ups]
    peak_mib["runtime_decode"] = round(peak_rss_bytes() / 2**20)
    # the audio needs none of the AR's packages: hand them back before upstream's fp32 codec loads
    tts.backend.unload([*tts.chunk_stages, "fast_ar"])
    _return_freed_memory()
    codec = C.load_codec(Path(weights_dir)) if tts.has_codec else None
    for row, up in zip(rows, ups):
        compare_audio(tts, codec, row, up["codes"])
    peak_mib["audio"] = round(peak_rss_bytes() / 2**20)
    checks = gate_rows(rows, gate)
    return {
        "passed": all(checks.values()),
        "checks": checks,
        "gate": gate,
        "peak_rss_mib": peak_mib,
        "worst": {
            "max_divergence_gap": max((r["max_divergence_gap"] or 0.0 for r in rows), default=0.0),
            "max_gap_in_noise": max((r["max_gap_in_noise"] or 0.0 for r in rows), default=0.0),
            "logits_db": min((r[k] for r in rows for k in ("head_logits_min_db", "fast_logits_min_db")
                              if r[k] is not None), default=None),
            "divergences": sum(len(r["divergences"]) for r in rows),
            "slow_hidden_db": min((r["slow_hidden_min_db"] for r in rows if r["slow_hidden_min_db"] is not None), default=None),
            "audio_snr_db": min((r["audio_snr_db"] for r in rows if r["audio_snr_db"] is not None), default=None),
        },
        "texts": rows,
    }
