"""Kokoro's end-to-end workload for `anetts bench`: the passage cut to about 3, 7, 15 and 30 s of
audio, through the runtime's `synthesize_tokens` (per-stage times, RTF), and upstream `KModel` on the
same token ids, style row and speed on CPU and, where torch has it, MPS."""
from __future__ import annotations

import logging
import sys
import time

import numpy as np

from anetts.bench import PASSAGE, UPSTREAM_DEVICES, BenchError, Workload, stats, usable_targets

log = logging.getLogger(__name__)

FRAMES_PER_SECOND = 40  # the duration predictor's frames (24 kHz / 600 samples)


def choose_prefixes(tts, words: list[str], voice: str, speed: float, lang: str, targets) -> list[dict]:
    """For each target (s), the longest word prefix of the passage whose predicted frames fit it."""
    from anetts.models.kokoro.frontend import phonemize

    pack = tts.voice_pack(voice)
    cache: dict[int, dict] = {}

    def measure(k: int) -> dict:
        if k not in cache:
            text = " ".join(words[:k])
            ps = phonemize(text, lang)
            ids, _ = tts._tokenize(ps)
            if len(ids) > tts.max_tokens:
                cache[k] = {"k": k, "frames": 10**9}
            else:
                ref_s = tts.style_row(pack, len(ps))
                frames = int(tts.predict_durations(ids, ref_s=ref_s, speed=speed).sum())
                cache[k] = {"k": k, "text": text, "phonemes": ps, "ids": ids, "ref_s": ref_s, "frames": frames}
        return cache[k]

    chosen = []
    for target in targets:
        cap = min(target * FRAMES_PER_SECOND, tts.max_frames)
        lo, hi = 1, len(words)
        if measure(lo)["frames"] > cap:
            raise BenchError(f"even one word of the passage exceeds {target} s")
        while lo < hi:  # largest k with frames(k) <= cap (frames grow with k, near enough)
            mid = (lo + hi + 1) // 2
            if measure(mid)["frames"] <= cap:
                lo = mid
            else:
                hi = mid - 1
        c = dict(measure(lo), target_s=target)
        if chosen and c["k"] == chosen[-1]["k"]:
            log.warning("target %s s gives the same text as %s s (passage or buckets too short)", target, chosen[-1]["target_s"])
        chosen.append(c)
    return chosen


def _upstream_device(device: str):
    import torch

    if device == "cpu":
        return torch.device("cpu"), None
    if device == "mps":
        mps = getattr(torch.backends, "mps", None)
        if sys.platform != "darwin" or mps is None or not mps.is_available():
            return None, f"torch has no MPS device on this machine ({sys.platform}, torch {torch.__version__})"
        return torch.device("mps"), None
    raise BenchError(f"--upstream {device!r}: choose from {list(UPSTREAM_DEVICES)}")


def _upstream_runner(kmodel, device):
    import torch

    model = kmodel.to(device)

    def run(text: dict) -> float:
        ids = torch.tensor([text["ids"]], dtype=torch.long, device=device)
        ref = torch.from_numpy(text["ref_s"]).to(device)
        torch.manual_seed(0)
        t0 = time.perf_counter()
        with torch.inference_mode():
            audio, _ = model.forward_with_tokens(ids, ref, text["speed"])
            if device.type == "mps":
                torch.mps.synchronize()
        return time.perf_counter() - t0

    return run


def workload(tts, *, targets, upstream, voice=None, speed=None, lang=None) -> Workload:
    voice = voice or tts.default_voice
    speed = 1.0 if speed is None else speed
    lang = lang or "en-us"
    texts = choose_prefixes(tts, PASSAGE.split(), voice, speed, lang,
                            tuple(usable_targets(targets, tts.max_frames / FRAMES_PER_SECOND)))
    for t in texts:
        t["speed"] = speed
    info, runs = {}, {}
    if upstream:
        from anetts.models.kokoro.weights import load_kmodel

        arts = tts.artifacts
        for dev_name in upstream:
            device, reason = _upstream_device(dev_name)
            if device is None:
                info[dev_name] = {"available": False, "reason": reason}
                continue
            t0 = time.perf_counter()
            kmodel = load_kmodel(arts.model_dir / arts.manifest.get("weights_dir", "weights"))
            runs[dev_name] = _upstream_runner(kmodel, device)
            info[dev_name] = {"available": True, "load_s": time.perf_counter() - t0}

    last: dict[int, object] = {}

    def run_e2e(t):
        r = tts.synthesize_tokens(t["ids"], ref_s=t["ref_s"], speed=speed, seed=0)
        last[t["target_s"]] = r
        return r.timings["total"], r.timings

    cases = {}
    for t in texts:
        cases[f"e2e:{t['target_s']}"] = (lambda t=t: run_e2e(t))
        for dev_name, run in runs.items():
            cases[f"upstream-{dev_name}:{t['target_s']}"] = (lambda t=t, run=run: (run(t), None))
    w = Workload(cases, rows=None, upstream=info, upstream_runs=set(runs),
                 settings={"voice": voice, "speed": speed, "lang": lang, "targets_s": [t["target_s"] for t in texts]},
                 notes=["end to end = runtime synthesize_tokens from token ids (no G2P)",
                        "upstream: KModel.forward_with_tokens on the same ids, style row and speed"])

    def rows(samples: dict, details: dict) -> list[dict]:
        out = []
        for t in texts:
            key = t["target_s"]
            r = last[key]
            warm = stats(samples[f"e2e:{key}"])
            stage_keys = [k for k in details[f"e2e:{key}"][0] if k not in ("total", "load")]
            row = {"target_s": key, "text": t["text"], "n_phonemes": len(t["phonemes"]), "n_tokens": len(t["ids"]),
                   "frames": t["frames"], "audio_s": r.seconds, "buckets": r.buckets, "warm": warm,
                   "rtf_median": warm["median_s"] / r.seconds,
                   "stages_median_s": {k: float(np.median([d.get(k, 0.0) for d in details[f"e2e:{key}"]]))
                                       for k in stage_keys},
                   "upstream": {}}
            for dev_name in sorted(w.upstream_runs):
                up = stats(samples[f"upstream-{dev_name}:{key}"])
                row["upstream"][dev_name] = {"warm": up, "rtf_median": up["median_s"] / r.seconds,
                                             "ratio_upstream_over_runtime": up["median_s"] / warm["median_s"]}
            out.append(row)
        return out

    w.rows = rows
    return w
