"""`anetts serve` under load on loopback: first audio vs whole request, throughput and latency at
several concurrencies, and the server's memory over 200 requests.

Starts `anetts serve` as a subprocess on a free port (its RSS is the server's alone), then:

1. a 3-sentence input: time to the first audio byte of a stream (`stream_format: audio`, pcm) and
   to its last byte, vs the whole request without streaming; the join error of the stream (the
   sample step at each join vs the 99th percentile of steps inside the audio) and its difference
   from the runtime's own sentence-chunked audio, in 16-bit steps;
2. 1, 4 and 16 concurrent clients sending one-sentence requests (wav): throughput, p50/p95
   latency, 429s (the documented answer when the queue is full) and any other error;
3. RSS after 0, 50, 100, 150 and 200 requests.

    python benchmarks/serve_load.py --model-dir artifacts/kokoro-tiny -o benchmarks/results/serve_load_kokoro-tiny.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

THREE = "The sun is out over the hills. We walk down to the park by the river. Birds sing in the tall trees."
ONE = "Hello there."


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def start_server(args, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "anetts.cli", "serve", "--model-dir", str(args.model_dir), "--port", str(port),
           "--workers", str(args.workers), "--queue", str(args.queue)]
    if args.backend:
        cmd += ["--backend", args.backend]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() - t0 > 300:
            raise SystemExit(f"the server did not start (exit {proc.poll()})")
        time.sleep(0.2)


def first_audio(url: str, model: str, voice: str, repeats: int) -> dict:
    rows = []
    for _ in range(repeats):
        body = {"model": model, "voice": voice, "input": THREE, "response_format": "pcm"}
        t0 = time.perf_counter()
        whole = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=600)
        t_whole = time.perf_counter() - t0
        whole.raise_for_status()
        t0, first, parts = time.perf_counter(), None, []
        with httpx.stream("POST", f"{url}/v1/audio/speech", json={**body, "stream_format": "audio"}, timeout=600) as r:
            r.raise_for_status()
            for part in r.iter_bytes():
                if part and first is None:
                    first = time.perf_counter() - t0
                parts.append(part)
        rows.append({"whole_request_s": t_whole, "stream_first_byte_s": first,
                     "stream_last_byte_s": time.perf_counter() - t0, "audio_s": len(whole.content) / 2 / 24000,
                     "stream": b"".join(parts)})
    med = {k: statistics.median(r[k] for r in rows) for k in ("whole_request_s", "stream_first_byte_s",
                                                             "stream_last_byte_s", "audio_s")}
    med["first_byte_fraction_of_whole"] = med["stream_first_byte_s"] / med["whole_request_s"]
    med["repeats"] = repeats
    return med, rows[-1]["stream"]


def join_error(stream: bytes, model_dir: Path, backend: str | None, voice: str) -> dict:
    """Joins of the streamed audio: the step across each join vs the steps inside the audio."""
    from anetts.loader import load

    tts = load(model_dir, backend=backend, threads=1)
    chunks = [c.audio for c in tts.stream(THREE, voice=voice, sentences=True)]
    want = np.round(np.clip(np.concatenate(chunks).astype(np.float64), -1, 1) * 32767)
    got = np.frombuffer(stream, "<i2").astype(np.float64)
    joins = np.cumsum([c.size for c in chunks])[:-1]
    steps = np.abs(np.diff(got))
    return {"chunks": len(chunks), "join_samples": joins.tolist(),
            "join_steps_lsb": [float(steps[j - 1]) for j in joins],
            "inner_step_p99_lsb": float(np.percentile(steps, 99)), "inner_step_max_lsb": float(steps.max()),
            "max_diff_vs_runtime_lsb": float(np.abs(got - want).max()) if got.size == want.size else None,
            "samples": int(got.size), "runtime_samples": int(want.size)}


def load_level(url: str, model: str, voice: str, clients: int, requests: int) -> dict:
    def one(_):
        t0 = time.perf_counter()
        r = httpx.post(f"{url}/v1/audio/speech", json={"model": model, "voice": voice, "input": ONE,
                                                       "response_format": "wav"}, timeout=600)
        return r.status_code, time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as ex:
        results = list(ex.map(one, range(requests)))
    wall = time.perf_counter() - t0
    ok = sorted(t for s, t in results if s == 200)
    return {"clients": clients, "requests": requests, "ok": len(ok),
            "status_429": sum(s == 429 for s, _ in results),
            "other_errors": sum(s not in (200, 429) for s, _ in results),
            "throughput_rps": len(ok) / wall, "wall_s": wall,
            "p50_s": float(np.percentile(ok, 50)) if ok else None, "p95_s": float(np.percentile(ok, 95)) if ok else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", type=Path, default=Path("artifacts/kokoro-tiny"))
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--queue", type=int, default=8)
    ap.add_argument("--voice", default=None, help="default: the server's default voice")
    ap.add_argument("--repeats", type=int, default=3, help="3-sentence requests per mode")
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--memory-requests", type=int, default=200)
    ap.add_argument("-o", "--output", type=Path, default=None)
    args = ap.parse_args(argv)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = start_server(args, port)
    url = f"http://127.0.0.1:{port}"
    try:
        health = httpx.get(f"{url}/health").json()
        model = health["model"]
        voice = args.voice or httpx.get(f"{url}/v1/audio/voices").json()["default"]
        out = {"model": model, "backend": health["backend"], "workers": args.workers, "queue": args.queue,
               "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
               "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])])}
        out["rss_kib"] = {"0": rss_kib(proc.pid)}
        out["first_audio"], stream = first_audio(url, model, voice, args.repeats)
        print(json.dumps(out["first_audio"]), flush=True)
        out["join"] = join_error(stream, args.model_dir, args.backend, voice)
        print(json.dumps(out["join"]), flush=True)
        out["load"] = []
        for c in (int(x) for x in args.levels.split(",")):
            row = load_level(url, model, voice, c, max(8, 2 * c))
            out["load"].append(row)
            print(json.dumps(row), flush=True)
        done = 2 * args.repeats + sum(r["requests"] for r in out["load"])
        out["rss_kib"][str(done)] = rss_kib(proc.pid)
        for target in range(50, args.memory_requests + 1, 50):
            while done < target:
                httpx.post(f"{url}/v1/audio/speech", json={"model": model, "voice": voice, "input": ONE,
                                                           "response_format": "wav"}, timeout=600).raise_for_status()
                done += 1
            out["rss_kib"][str(done)] = rss_kib(proc.pid)
        print(json.dumps({"rss_kib": out["rss_kib"]}), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
