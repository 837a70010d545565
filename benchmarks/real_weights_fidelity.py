#!/usr/bin/env python
"""Real-weights fidelity: build Kokoro-82M from the int8 ONNX export, per-stage parity, end to end.

1. (``--build``) `make onnx-weights` must have fetched the export; this builds the model entry
   (default ``kokoro-82m-onnx``) with the project's own DAG, restricted to the buckets given
   (``--buckets duration=64 generator=3 ...``; a config copy is written beside the artifacts).
2. The per-stage parity table from the parity reports (MIL executor vs upstream eager fp32).
3. End to end: the runtime composing the compiled stages (``--backend mil`` by default) vs
   upstream ``KModel.forward_with_tokens`` on the same phonemes and style row, with the runtime's
   source draws replayed into upstream's SineGen (re-seeding torch does not reproduce them).
   Metrics: durations equal, waveform SNR, log-mel correlation / L1 (nats), F0 error (Hz, on
   frames upstream calls voiced), and the seed floor: upstream against itself with another draw.
4. The ONNX export itself vs upstream with the converted weights (onnxruntime draws its own
   noise): output length (= durations) and log-mel correlation, a check of the conversion.

    nice -n 10 python benchmarks/real_weights_fidelity.py --build --buckets duration=64 f0ntrain=3 \\
        decoder_pre=3 generator=3 -o fidelity.json
"""
from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from anetts import artifacts  # noqa: E402
from anetts.loader import load  # noqa: E402
from anetts.models.kokoro.dsp import SAMPLE_RATE  # noqa: E402
from anetts.models.kokoro.end_to_end import compare_texts  # noqa: E402
from anetts.models.kokoro.weights import load_kmodel  # noqa: E402
from anetts.runtime.audio import log_mel_similarity  # noqa: E402

log = logging.getLogger("real_weights_fidelity")

# Japanese phoneme strings in Kokoro's vocab (the export's voices are Japanese), short enough
# for a 3 s generator bucket: "The weather is nice today." / "Thank you very much."
# / "I'll go to the station tomorrow."
TEXTS = (
    "kʲoːwa ii teŋki desɯ ne.",
    "doːmo aɾiɡatoː ɡozaimasɯ.",
    "aɕita eki e ikimasɯ.",
)


def build(model: str, buckets: dict[str, list[int]], cores: int) -> Path:
    cfg = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    cfg["model"] = model
    for stage, sizes in buckets.items():
        cfg["families"]["kokoro"]["stages"][stage]["buckets"] = sizes
    out = artifacts.model_dir(model, REPO / "artifacts")
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "fidelity-config.yaml"
    config_path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    cmd = [sys.executable, "-m", "snakemake", "all", "--configfile", str(config_path), "--cores", str(cores)]
    log.info("building: %s", " ".join(cmd))
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, check=True)
    log.info("build took %.0f s", time.perf_counter() - t0)
    return config_path


def parity_table(model: str) -> list[dict]:
    rows = []
    for path in sorted((artifacts.model_dir(model, REPO / "artifacts") / "parity").glob("*/*.json")):
        rep = json.loads(path.read_text(encoding="utf-8"))
        mil = rep["backends"].get("mil") or {}
        outs = mil.get("outputs", {})
        rows.append({
            "stage": rep["stage"], "bucket": rep["bucket"], "passed": rep["passed"], "gate": rep["gate"],
            "mil_min_snr_db": mil.get("min_snr_db"),
            "outputs_snr_db": {k: v.get("snr_db") for k, v in outs.items()},
            "exact_fraction": {k: v["exact_fraction"] for k, v in outs.items() if "exact_fraction" in v},
        })
    return rows


def end_to_end(model: str, backend: str, voice: str | None, seed: int) -> list[dict]:
    """The end_to_end rule's comparison (anetts.models.kokoro.end_to_end) on TEXTS, any backend."""
    tts = load(artifacts.model_dir(model, REPO / "artifacts"), backend=backend)
    rows = compare_texts(tts, load_kmodel(tts.artifacts.weights_dir), TEXTS, seed, voice)
    for row in rows:
        log.info("e2e %s", {k: row[k] for k in ("tokens", "frames", "durations_equal", "waveform_snr_db", "log_mel_corr")})
    return rows


def onnx_vs_upstream(model: str, voice: str | None) -> list[dict]:
    import onnxruntime as ort

    model_dir = artifacts.model_dir(model, REPO / "artifacts")
    weights = model_dir / "weights"
    source = json.loads((weights / "source.json").read_text(encoding="utf-8"))
    onnx_path = REPO / source["model"] if not Path(source["model"]).is_absolute() else Path(source["model"])
    kmodel = load_kmodel(weights)
    vocab = json.loads((weights / "config.json").read_text(encoding="utf-8"))["vocab"]
    voice = voice or source["voices"][0]
    pack = torch.load(weights / "voices" / f"{voice}.pt", weights_only=True).numpy()
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    rows = []
    for ps in TEXTS:
        ids = [0, *[vocab[c] for c in ps if c in vocab], 0]
        ref_s = pack[len(ps) - 1].astype(np.float32)
        with torch.inference_mode():
            audio, _ = kmodel.forward_with_tokens(torch.tensor([ids]), torch.from_numpy(ref_s), 1.0)
        theirs = sess.run(None, {"tokens": np.array([ids], np.int64), "style": ref_s,
                                 "speed": np.ones(1, np.float32)})[0].reshape(-1)
        sim = log_mel_similarity(audio.numpy().reshape(-1), theirs, SAMPLE_RATE)
        rows.append({"phonemes": ps, "length_upstream": sim["length_a"], "length_onnx": sim["length_b"],
                     "log_mel_corr": sim["log_mel_corr"]})
        log.info("onnx vs upstream %s", rows[-1])
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="kokoro-82m-onnx")
    ap.add_argument("--build", action="store_true", help="run the DAG first (else use what artifacts/ holds)")
    ap.add_argument("--buckets", nargs="*", default=[], metavar="STAGE=SIZE[,SIZE]")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--backend", default="mil", help="runtime backend for the end-to-end comparison")
    ap.add_argument("--voice", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-onnx", action="store_true", help="skip the onnxruntime check of the conversion")
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    buckets = {}
    for spec in args.buckets:
        stage, _, sizes = spec.partition("=")
        buckets[stage] = [int(s) for s in sizes.split(",")]
    result = {"model": args.model, "backend": args.backend, "buckets": buckets}
    if args.build:
        result["config"] = str(build(args.model, buckets, args.cores).relative_to(REPO))
    result["parity"] = parity_table(args.model)
    for row in result["parity"]:
        print(f"{row['stage']:12s} {row['bucket']:5s} passed={row['passed']} mil_min_snr={row['mil_min_snr_db']} "
              f"{row['outputs_snr_db']} {row['exact_fraction'] or ''}")
    result["end_to_end"] = end_to_end(args.model, args.backend, args.voice, args.seed)
    for row in result["end_to_end"]:
        print(f"e2e {row['tokens']:3d} tok {row['frames']:4d} fr  dur_equal={row['durations_equal']}  "
              f"SNR {row['waveform_snr_db']:.1f} dB (floor {row['seed_floor']['waveform_snr_db']:.1f})  "
              f"log-mel corr {row['log_mel_corr']:.4f} (floor {row['seed_floor']['log_mel_corr']:.4f})  "
              f"L1 {row['log_mel_l1']:.3f}  F0 rmse {row['f0_rmse_hz_voiced']} Hz")
    if not args.skip_onnx:
        result["onnx_vs_upstream"] = onnx_vs_upstream(args.model, args.voice)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(args.output.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=2), encoding="utf-8")
    tmp.replace(args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
