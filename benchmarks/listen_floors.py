#!/usr/bin/env python
"""The listener gate's floors and controls on a real-weights Kokoro build (#40).

The corpus (anetts/listen/corpus) is spoken by upstream ``KModel`` at seeds 0 (the reference) and 1
(the floor), and by each candidate; every candidate is judged as rule ``listen`` judges the build
(anetts.listen.gate), with the margins of the model's ``listen`` block or ``--margins``:

| candidate | what it is |
|---|---|
| ``upstream-seed2``, ``-seed3`` | upstream at a third and a fourth seed: positive controls, what the margins must admit |
| ``configured`` | the build's packages as configured, MIL executor (what rule ``listen`` runs) |
| ``torch`` | the build's fp32 TorchScript exports (the torch backend) |
| ``fp16`` | every stage re-converted from the same exports at fp16 with no fp32 ops, MIL executor |
| ``int8`` | the configured packages with every weight int8 per channel (coremltools linear), MIL executor: the negative control, which must fail |

``fp16`` and ``int8`` are built here into ``artifacts/<model>/listen_controls/`` and composed through an in-memory manifest (as the
end-to-end gate composes the build): they carry the base packages' parity verdicts, so they are a
measurement, never an artifact. Audio and features are cached in ``--work``, so a rerun only does what
is missing.

    python benchmarks/listen_floors.py --model kokoro-82m-onnx --work /tmp/listen_work \\
        -o benchmarks/results/listen_kokoro-82m-onnx.json
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import yaml

from anetts import artifacts
from anetts.listen import gate as G
from anetts.models.kokoro import listen as L
from anetts.models.kokoro.dsp import SAMPLE_RATE
from anetts.workflow import WorkflowConfig

log = logging.getLogger("listen_floors")
CACHED: dict[str, int] = {}  # side -> clips whose audio came from an earlier run's cache (their seconds are not counted)
CANDIDATES = ("upstream-seed2", "upstream-seed3", "configured", "torch", "fp16", "int8")
INT8 = {"mode": "linear", "dtype": "int8", "granularity": "per_channel"}  # compress.DEFAULTS fill the rest


def _packages(wf: WorkflowConfig, model: str):
    """(stage, bucket, package, report, functions dir, export report) of every package of the build."""
    for stage in wf.stages(model):
        for bucket in wf.buckets(model, stage):
            ex = artifacts.export_files(model, stage, bucket)
            yield (stage, bucket, artifacts.package_path(model, stage, bucket), artifacts.package_report(model, stage, bucket),
                   ex["functions"], ex["report"])


def _manifest_inputs(wf: WorkflowConfig, model: str, packages: list, reports: list) -> dict:
    return dict(weights_dir=artifacts.weights_dir(model), reports=reports, packages=packages,
                torchscripts=wf.torchscripts(model), scenarios=wf.scenarios(model), parity=wf.parity_reports(model),
                model_meta=wf.model_meta(model), stages=wf.stage_settings(model), assets_dir=artifacts.assets_dir(model))


def _runtime(wf: WorkflowConfig, model: str, packages: list, reports: list):
    from anetts.compile.manifest import build_manifest
    from anetts.verify.end_to_end import compiled_runtime

    model_dir = artifacts.model_dir(model)
    return compiled_runtime(model_dir, build_manifest(model_dir, **_manifest_inputs(wf, model, packages, reports)))


def _rebuilt(wf: WorkflowConfig, model: str, work: Path, name: str, make) -> tuple[list, list, dict]:
    """Every package of the build remade by ``make(stage, bucket, package, report, functions, export_report,
    out_package, out_report)`` into ``work/name`` (kept when already there); returns the lists and the seconds."""
    packages, reports, seconds = [], [], {}
    for stage, bucket, pkg, rep, functions, export_report in _packages(wf, model):
        out_pkg = work / name / stage / f"{bucket}.mlpackage"
        out_rep = out_pkg.with_suffix(".json")
        if not out_rep.is_file():
            t0 = time.perf_counter()
            out_pkg.parent.mkdir(parents=True, exist_ok=True)
            make(stage, bucket, pkg, rep, functions, export_report, out_pkg, out_rep)
            seconds[f"{stage}/{bucket}"] = round(time.perf_counter() - t0, 1)
            log.info("%s: %s/%s in %.0f s", name, stage, bucket, seconds[f"{stage}/{bucket}"])
        packages.append(str(out_pkg))
        reports.append(str(out_rep))
    return packages, reports, seconds


def make_fp16(wf, model):
    from anetts.compile.convert import convert_export
    from anetts.options import ConvertOptions

    def make(stage, bucket, pkg, rep, functions, export_report, out_pkg, out_rep):
        opts = {**wf.convert_options(model, stage), "precision": "fp16", "fp32_ops": []}
        convert_export(functions, export_report, out_pkg, out_rep, ConvertOptions.make(**opts), wf.model_meta(model))
    return make


def make_int8(wf, model):
    from anetts.compile.compress import compress_model, resolve_settings
    from anetts.compile.reproducible import stabilize_package

    def make(stage, bucket, pkg, rep, functions, export_report, out_pkg, out_rep):
        settings = resolve_settings(INT8, "int8")
        mlmodel, gained, _ = compress_model(pkg, {**settings, "variant": "int8-all"}, f"int8-all {stage}/{bucket}")
        mlmodel.save(str(out_pkg))
        stabilize_package(out_pkg)
        base = json.loads(Path(rep).read_text(encoding="utf-8"))
        out_rep.write_text(json.dumps({**base, "package": out_pkg.name, "bytes": artifacts.tree_bytes(out_pkg),
                                       "compression": {"settings": settings, "constexpr_ops": gained}}), encoding="utf-8")
    return make


def _cached(path: Path, compute):
    if path.is_file():
        return pickle.loads(path.read_bytes())
    value = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(value))
    return value


def _key(item) -> str:
    return f"{item.sentence.language}-{item.sentence.index:03d}-{item.voice}"


def render(items, side: str, work: Path, speak) -> float:
    """Each item's audio on ``side`` (cached as ``work/audio/<side>/<language>-<index>-<voice>.npy``); seconds spent."""
    spent = 0.0
    for item in items:
        path = work / "audio" / side / f"{_key(item)}.npy"
        if path.is_file():
            item.audio[side] = np.load(path)
            CACHED[side] = CACHED.get(side, 0) + 1
            continue
        t0 = time.perf_counter()
        item.audio[side] = np.asarray(speak(item), np.float32).reshape(-1)
        spent += time.perf_counter() - t0
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, item.audio[side])
    return spent


def hear(items, side: str, work: Path, listener) -> float:
    from anetts.listen.metrics import features

    spent = 0.0
    for item in items:
        path = work / "heard" / side / f"{_key(item)}.pkl"

        def compute(item=item):
            nonlocal spent
            t0 = time.perf_counter()
            f = features(listener, item.audio[side], SAMPLE_RATE, L.WHISPER_LANGUAGE[item.sentence.language])
            spent += time.perf_counter() - t0
            return f
        item.heard[side] = _cached(path, compute)
    return spent


def judged(items, side: str, margins: G.Margins) -> dict:
    """The verdict on ``side`` as the candidate; per language its metrics, the floor's and the checks (no rows)."""
    clips: dict[str, list[dict]] = {}
    for item in items:
        clips.setdefault(item.sentence.language, []).append({
            "sentence": {"index": item.sentence.index, "set": item.sentence.set, "voice": item.voice},
            "reference": item.heard["reference"], "floor": item.heard["floor"], "candidate": item.heard[side]})
    report = G.judge(clips, margins)
    out = {"passed": report["passed"], "failed": report["failed"], "languages": {}}
    for language, lang in report["languages"].items():
        transcripts_differ = sum(r["candidate"]["token_edits"] > 0 for r in lang["rows"])
        by_set = {}
        for r in lang["rows"]:
            s = by_set.setdefault(r["sentence"]["set"], {"tokens": 0, "edits": 0})
            s["tokens"] += r["candidate"]["tokens"]
            s["edits"] += r["candidate"]["token_edits"]
        out["languages"][language] = {
            "clips": lang["clips"], "audio_s": round(lang["seconds"], 2),
            "candidate": {k: c["candidate"] for k, c in lang["checks"].items()},
            "floor": {k: c["floor"] for k, c in lang["checks"].items()},
            "failed": lang["failed"], "clips_whose_transcript_differs": transcripts_differ,
            "token_error_rate_by_set": {k: v["edits"] / max(v["tokens"], 1) for k, v in by_set.items()}}
    return out

def write(path: Path, args, settings, items, margins, seconds, results, done: bool) -> None:
    audio_s = sum(item.audio["reference"].size for item in items) / SAMPLE_RATE
    out = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "command": "listen_floors.py " + " ".join(sys.argv[1:]),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "complete": done,
        "model": args.model, "voices": settings["voices"],
        "seeds": {"reference": 0, "floor": 1, **{c: int(c[len("upstream-seed"):]) for c in results
                                                   if c.startswith("upstream-seed")}},
        "sentences": {lang: sum(i.sentence.language == lang for i in items) for lang in settings["voices"]},
        "audio_s_per_side": round(audio_s, 2),
        "margins": margins.values,
        "seconds": seconds,
        # per second of audio, over the sides rendered and heard whole in this run (not from the cache)
        "listen_s_per_audio_s": {k: round(v["listen"] / audio_s, 3) for k, v in seconds.items() if not CACHED.get(k)},
        "render_s_per_audio_s": {k: round(v["render"] / audio_s, 3) for k, v in seconds.items() if not CACHED.get(k)},
        "cached_clips": CACHED,
        "candidates": results,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="kokoro-82m-onnx")
    ap.add_argument("--config", type=Path, default=REPO / "config.yaml")
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    ap.add_argument("--limit", type=int, default=None, help="sentences per corpus set (default: all)")
    ap.add_argument("--margins", type=Path, default=None, help="a YAML/JSON file of margins (default: the config's)")
    ap.add_argument("--work", type=Path, required=True, help="cache of audio, features and rebuilt packages")
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    os.chdir(REPO)  # the workflow's paths are relative to the checkout

    from anetts.listen.toolkit import Listener

    config = yaml.safe_load(args.config.read_text(encoding="utf-8"))
    wf = WorkflowConfig(config, root=REPO)
    settings = wf.listen_settings(args.model)
    margins_cfg = yaml.safe_load(args.margins.read_text()) if args.margins else settings["margins"]
    margins = G.Margins.from_config(dict(margins_cfg))
    candidates = [c for c in args.candidates.split(",") if c]
    unknown = sorted(set(candidates) - set(CANDIDATES))
    if unknown:
        ap.error(f"--candidates: unknown {unknown}; known {list(CANDIDATES)}")
    work = args.work / args.model
    # the runtime reads packages only inside the model's folder (git-ignored, as all of artifacts/)
    controls = artifacts.model_dir(args.model) / "listen_controls"
    items = L.corpus(dict(settings["voices"]), args.limit)
    upstream = L.Upstream(artifacts.weights_dir(args.model))
    listener = Listener()
    seconds: dict[str, dict] = {}

    def side(name: str, speak, build_s: dict | None = None):
        s = {"render": render(items, name, work, speak)}
        s["listen"] = hear(items, name, work, listener)
        if build_s:
            s["build"] = build_s
        seconds[name] = s

    side("reference", lambda it: upstream.speak(it.sentence.text, it.voice, 0))
    side("floor", lambda it: upstream.speak(it.sentence.text, it.voice, 1))
    results = {}
    for name in candidates:
        build_s = None
        if name.startswith("upstream-seed"):
            speak = lambda it, seed=int(name[len("upstream-seed"):]): upstream.speak(it.sentence.text, it.voice, seed)
        else:
            if name in ("configured", "torch"):
                tts = _runtime(wf, args.model, wf.packages(args.model), wf.package_reports(args.model))
                if name == "torch":
                    from anetts.runtime import Runner
                    tts = type(tts)(tts.artifacts, Runner("torch", tts.artifacts))
            else:
                make = {"fp16": make_fp16, "int8": make_int8}[name](wf, args.model)
                packages, reports, build_s = _rebuilt(wf, args.model, controls, name, make)
                tts = _runtime(wf, args.model, packages, reports)
            speak = lambda it, tts=tts: tts.synthesize(it.sentence.text, voice=it.voice).audio
            log.info("%s: backend %s", name, tts.backend.name)
        side(name, speak, build_s)
        results[name] = judged(items, name, margins)
        log.info("%s: passed %s, failed %s", name, results[name]["passed"], results[name]["failed"])
        write(args.output, args, settings, items, margins, seconds, results, done=False)
    write(args.output, args, settings, items, margins, seconds, results, done=True)
    print(json.dumps({k: {"passed": v["passed"], "failed": v["failed"]} for k, v in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
