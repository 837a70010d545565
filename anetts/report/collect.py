"""Read and check every input of a report; a missing or malformed one is an error naming it."""
from __future__ import annotations

import base64
import csv
import io
import json
import math
from pathlib import Path

import numpy as np

from anetts.artifacts import job_usage
from anetts.jobserver import read_usage


class ReportInputError(ValueError):
    """An input of the report is missing or unreadable; the message names the file."""


def _missing(path: Path, what: str) -> ReportInputError:
    return ReportInputError(f"report input {path} ({what}) is missing")


def read_json(path, what: str, keys: tuple[str, ...] = ()) -> dict:
    path = Path(path)
    if not path.is_file():
        raise _missing(path, what)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReportInputError(f"report input {path} ({what}) is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ReportInputError(f"report input {path} ({what}) must hold a JSON object, got {type(data).__name__}")
    for k in keys:
        if k not in data:
            raise ReportInputError(f"report input {path} ({what}) lacks key {k!r}")
    return data


def read_png(path, what: str) -> str:
    """The file as a base64 data URI, after checking it is a PNG."""
    path = Path(path)
    if not path.is_file():
        raise _missing(path, what)
    raw = path.read_bytes()
    if not raw.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ReportInputError(f"report input {path} ({what}) is not a PNG image")
    return "data:image/png;base64," + base64.b64encode(raw).decode("ascii")


def read_benchmark_tsv(path) -> dict:
    """One Snakemake `benchmark:` file: wall s, CPU s, peak RSS (MB) of its last run; CPU and RSS
    from `artifacts.job_usage` beside it for a job that ran in the job server."""
    path = Path(path)
    if not path.is_file():
        raise _missing(path, "Snakemake job benchmark")
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        row = rows[-1]
        out = {"seconds": float(row["s"]), "cpu_seconds": float(row["cpu_time"]), "max_rss_mb": _float(row["max_rss"])}
    except (OSError, IndexError, KeyError, TypeError, ValueError) as e:
        raise ReportInputError(f"report input {path} (Snakemake job benchmark) is not a benchmark TSV: {e!r}") from e
    warm = read_usage(job_usage(path))
    return {**out, **warm} if warm else out


def _float(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None  # Snakemake writes NA when it could not sample a short job
    return x if math.isfinite(x) else None


def wav_data_uri(x: np.ndarray, sample_rate: int) -> str:
    """16-bit PCM mono WAV as a data URI (half the bytes of float, plenty for listening)."""
    import wave

    pcm = (np.clip(np.asarray(x, np.float64), -1.0, 1.0) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(int(sample_rate))
        w.writeframes(pcm.tobytes())
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def read_waveforms(path, region, name: str) -> dict[str, np.ndarray]:
    """Reference and package audio (output `name`) of a parity run, cut to the valid region."""
    path = Path(path)
    if not path.is_file():
        raise _missing(path, "audio parity arrays")
    try:
        with np.load(path) as z:
            out = {k.split("/", 1)[0]: np.asarray(z[k]).reshape(-1) for k in z.files if k.endswith(f"/{name}")}
    except (OSError, ValueError, KeyError) as e:
        raise ReportInputError(f"report input {path} (audio parity arrays) cannot be read: {e}") from e
    if "reference" not in out or len(out) < 2:
        raise ReportInputError(f"report input {path} (audio parity arrays) lacks reference/{name} and a backend's {name}")
    lo, hi = (int(region[0]), int(region[1])) if region else (0, None)
    return {k: v[lo:hi] for k, v in out.items()}


def read_listen(path, clips_dir) -> dict:
    """The listener gate's report, its worst clips (reference and candidate) as wav data URIs."""
    import soundfile as sf

    d = read_json(path, "listener gate report", ("passed", "languages"))
    for language, lang in d["languages"].items():
        for metric, worst in (lang.get("worst") or {}).items():
            for side in ("reference", "candidate"):
                wav = Path(clips_dir or Path(path).with_suffix("")) / worst[side]
                if not wav.is_file():
                    raise _missing(wav, f"listener gate clip ({language}, {metric})")
                try:
                    audio, rate = sf.read(wav, dtype="float32")
                except (RuntimeError, ValueError) as e:
                    raise ReportInputError(f"report input {wav} (listener gate clip) is not audio: {e}") from e
                worst[f"{side}_uri"] = wav_data_uri(audio, rate)
    d["_path"] = str(path)
    return d


def bench_result(path) -> dict:
    from anetts.bench import BenchError, validate_bench

    data = read_json(path, "bench JSON")
    try:
        return validate_bench(data, f"report input {path} (bench JSON)")
    except BenchError as e:
        raise ReportInputError(str(e)) from e


def collect(inputs: dict[str, list[str]]) -> dict:
    """Everything the report shows, read from `inputs` (see :mod:`anetts.report.inputs`)."""
    from anetts.report.inputs import KEYS

    unknown = set(inputs) - set(KEYS)
    if unknown:
        raise ReportInputError(f"unknown report input groups {sorted(unknown)}; expected {list(KEYS)}")
    for k in ("manifest", "parity_summary"):
        if len(inputs.get(k, [])) != 1:
            raise ReportInputError(f"the report needs exactly one {k} input, got {inputs.get(k)}")
    manifest = read_json(inputs["manifest"][0], "manifest", ("model", "family", "packages", "stages", "provenance"))
    summary = read_json(inputs["parity_summary"][0], "parity summary", ("buckets", "all_passed"))
    data = {"manifest": manifest, "manifest_path": inputs["manifest"][0], "summary": summary, "sources": {}}

    def keyed(group: str, what: str, keys: tuple[str, ...]):
        out = []
        for p in inputs.get(group, []):
            d = read_json(p, what, keys)
            d["_path"] = str(p)
            out.append(d)
        return out

    data["parity"] = keyed("parity", "parity report", ("stage", "bucket", "gate", "backends", "passed"))
    data["inspect"] = keyed("inspect", "inspect JSON", ("bytes", "functions", "lint", "deployment_target"))
    data["package_reports"] = keyed("package_reports", "package report", ("stage", "bucket", "bytes"))
    data["bundles"] = keyed("bundles", "bundle report", ("bundle_bytes", "weight_bytes_fp16", "ratio", "functions"))
    data["bundle_parity"] = keyed("bundle_parity", "bundle parity report", ("stage", "functions", "passed"))
    for r in data["parity"]:
        if "mil" not in r["backends"]:
            raise ReportInputError(f"report input {r['_path']} (parity report) has no 'mil' backend")
    if len(data["inspect"]) != len(data["parity"]):
        raise ReportInputError(f"{len(data['parity'])} parity reports but {len(data['inspect'])} inspect JSONs")
    data["waveform_plot"] = [read_png(p, "parity waveform plot") for p in inputs.get("waveform_plot", [])]

    from anetts.report.inputs import audio_output

    audio_decl = audio_output(manifest["family"])
    data["audio_output"] = audio_decl
    name = audio_decl.get("output", "")
    regions = {r["_path"]: r.get("valid_regions", {}).get(name) for r in data["parity"]}
    audio = []
    for p in inputs.get("parity_arrays", []):
        report_path = str(Path(p).with_name(Path(p).name.replace(".outputs.npz", ".json")))
        match = next((r for r in data["parity"] if Path(r["_path"]) == Path(report_path)), None)
        if match is None:
            raise ReportInputError(f"report input {p} (audio parity arrays) has no parity report {report_path} among the inputs")
        if name not in match.get("valid_regions", {}):  # its package ends before the audio (a folded generator)
            continue
        waves = read_waveforms(p, regions[match["_path"]], name)
        audio.append({"stage": match["stage"], "bucket": match["bucket"], "waves": waves})
    data["audio"] = audio

    jobs = []
    for p in inputs.get("job_benchmarks", []):
        row = read_benchmark_tsv(p)
        parts = Path(p).with_suffix("").parts
        i = parts.index("benchmarks") if "benchmarks" in parts else len(parts) - 2
        row["rule"] = parts[i + 1] if len(parts) > i + 2 else Path(p).stem
        row["job"] = "/".join(parts[i + 1:])
        jobs.append(row)
    data["jobs"] = jobs
    data["runtime_benchmarks"] = keyed("runtime_benchmarks", "benchmark JSON", ())
    data["bench"] = []
    for p in inputs.get("bench", []):
        d = bench_result(p)
        d["_path"] = str(p)
        data["bench"].append(d)

    data["listen"] = [read_listen(p, inputs.get("listen_clips", [None])[0]) for p in inputs.get("listen", [])]

    prov = {}
    for group in ("parity", "inspect", "package_reports", "bundles", "bundle_parity", "runtime_benchmarks", "bench"):
        for d in data[group]:
            if "provenance" in d:
                prov.setdefault(json.dumps(d["provenance"], sort_keys=True), []).append(d["_path"])
    for name, d in (("manifest", manifest), ("parity summary", summary)):
        if "provenance" in d:
            prov.setdefault(json.dumps(d["provenance"], sort_keys=True), []).append(name)
    data["provenance"] = [{"block": json.loads(k), "files": v} for k, v in prov.items()]
    return data
