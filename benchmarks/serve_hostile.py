"""`anetts serve` against what issue #38 measured: a served model's memory and first request, its
throughput with one worker and two, the largest voice blend, and (Fish) the server's answer to
`/health` while it handles the largest upload a client may send.

Each figure starts `anetts serve` as a subprocess on a free port (its RSS is the server's alone):

1. first request vs warm: the wall time of the first speech request after `/health` answers, then the
   median of 5 more of the same request;
2. RSS after 0, 50, 100, 150 and 200 mixed requests: texts from one sentence to ~20 s of audio, every
   format, whole / streamed audio / SSE, captioned speech, blends, speeds;
3. throughput of 8 requests from 4 clients, with --workers 1 and with --workers 2 (one thread each);
4. the time of a request whose voice is the largest blend the server allows (MAX_TERMS terms), and
   (``--blend-terms``) of a longer one, refused or not;
5. with ``--fish-model-dir``: a FLAC of silence as long as fits the body limit, uploaded as a voice,
   while a second client polls `/health` every 50 ms: the longest `/health` answer and the RSS rise.

``--code DIR`` runs the server from another checkout (DIR on PYTHONPATH), for a before/after pair.

    python benchmarks/serve_hostile.py --model-dir artifacts/kokoro-tiny --fish-model-dir artifacts/fish-tiny \\
        -o benchmarks/results/serve_hostile_kokoro-tiny.json
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

TEXTS = [
    "Hello there.",
    "The sun is out over the hills. We walk down to the park by the river.",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair.",
    "Call me at 555 0199 on the 3rd of May, or write to 42 Elm Street before 9:30 in the morning.",
    "Birds sing in the tall trees. The wind is cool. A boat drifts on the lake, and the children laugh "
    "as they run along the shore, chasing the gulls that rise and settle again on the warm sand.",
]
FORMATS = ["wav", "mp3", "pcm", "flac", "opus"]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, args, model_dir: Path, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "anetts.cli", "serve", "--model-dir", str(Path(model_dir).resolve()),
               "--port", str(self.port), "--backend", args.backend, "--threads", "1", *extra]
        env, cwd = dict(os.environ), None
        if args.code:  # `python -m` puts the working directory first on sys.path
            env["PYTHONPATH"] = cwd = str(Path(args.code).resolve())
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=cwd)
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.perf_counter() - self.t0 > 600:
                raise SystemExit(f"the server did not start (exit {self.proc.poll()}): {' '.join(cmd)}")
            time.sleep(0.1)
        self.start_s = time.perf_counter() - self.t0
        self.health = httpx.get(f"{self.url}/health").json()
        self.model = self.health["model"]

    def rss(self) -> int:
        return rss_kib(self.proc.pid)

    def speech(self, **body) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/audio/speech", json={"model": self.model, **body}, timeout=600)

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def first_vs_warm(s: Server, voice: str) -> dict:
    body = {"voice": voice, "input": TEXTS[1], "response_format": "wav"}
    t0 = time.perf_counter()
    s.speech(**body).raise_for_status()
    first = time.perf_counter() - t0
    warm = []
    for _ in range(5):
        t0 = time.perf_counter()
        s.speech(**body).raise_for_status()
        warm.append(time.perf_counter() - t0)
    return {"server_start_s": s.start_s, "first_request_s": first, "warm_median_s": statistics.median(warm),
            "first_over_warm": first / statistics.median(warm)}


def mixed(s: Server, voices: list[str], n: int) -> dict:
    rss = {"0": s.rss()}
    statuses: dict[str, int] = {}
    blend = f"{voices[0]}(0.6)+{voices[-1]}(0.4)"
    for i in range(n):
        text = TEXTS[i % len(TEXTS)]
        voice = blend if i % 7 == 3 else voices[i % len(voices)]
        fmt = FORMATS[i % len(FORMATS)]
        kind = i % 4
        if kind == 1 and fmt in ("pcm", "wav", "opus"):
            with httpx.stream("POST", f"{s.url}/v1/audio/speech", timeout=600,
                              json={"model": s.model, "voice": voice, "input": text, "response_format": fmt,
                                    "stream_format": "audio"}) as r:
                r.read()
                code = r.status_code
        elif kind == 2:
            with httpx.stream("POST", f"{s.url}/v1/audio/speech", timeout=600,
                              json={"model": s.model, "voice": voice, "input": text, "response_format": "pcm",
                                    "stream_format": "sse"}) as r:
                r.read()
                code = r.status_code
        elif kind == 3:
            code = httpx.post(f"{s.url}/v1/audio/captioned_speech", timeout=600,
                              json={"model": s.model, "voice": voice, "input": text, "response_format": "wav"}).status_code
        else:
            code = s.speech(voice=voice, input=text, response_format=fmt, speed=(0.8, 1.0, 1.25)[i % 3]).status_code
        statuses[str(code)] = statuses.get(str(code), 0) + 1
        if (i + 1) % 50 == 0:
            rss[str(i + 1)] = s.rss()
            print(json.dumps({"requests": i + 1, "rss_mib": s.rss() / 1024}), flush=True)
    return {"rss_kib": rss, "statuses": statuses}


def throughput(args, model_dir: Path, voice: str, workers: int) -> dict:
    with Server(args, model_dir, "--workers", str(workers)) as s:
        s.speech(voice=voice, input=TEXTS[1], response_format="wav").raise_for_status()

        def one(_):
            return s.speech(voice=voice, input=TEXTS[1], response_format="wav").status_code

        t0 = time.perf_counter()
        with ThreadPoolExecutor(4) as ex:
            codes = list(ex.map(one, range(8)))
        wall = time.perf_counter() - t0
    return {"workers": workers, "requests": 8, "clients": 4, "ok": codes.count(200), "wall_s": wall,
            "requests_per_s": codes.count(200) / wall}


def blends(s: Server, voices: list[str], terms: list[int]) -> list[dict]:
    rows = []
    for n in terms:
        spec = "+".join(f"{voices[i % len(voices)]}_{i}" if i >= len(voices) else voices[i] for i in range(n))
        t0 = time.perf_counter()
        r = s.speech(voice=spec, input="Hi.", response_format="pcm")
        rows.append({"terms": n, "chars": len(spec), "status": r.status_code, "seconds": time.perf_counter() - t0,
                     "message": r.json()["error"]["message"][:160] if r.status_code != 200 else None})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def silence_flac(seconds_max: float, limit_bytes: int) -> tuple[bytes, float]:
    """The longest FLAC of silence (44.1 kHz mono) that fits ``limit_bytes``, by doubling."""
    import soundfile as sf

    best, secs = None, 60.0
    while secs <= seconds_max:
        buf = io.BytesIO()
        sf.write(buf, np.zeros(int(secs * 44100), np.float32), 44100, format="FLAC")
        if buf.tell() > limit_bytes - 4096:
            break
        best = (buf.getvalue(), secs)
        secs *= 2
    return best


def upload_bomb(args) -> dict:
    with Server(args, args.fish_model_dir, "--max-frames", "6") as s:
        data, secs = silence_flac(4 * 3600, 16 << 20)
        lat, stop = [], threading.Event()

        def poll():
            while not stop.is_set():
                t0 = time.perf_counter()
                httpx.get(f"{s.url}/health", timeout=120)
                lat.append(time.perf_counter() - t0)
                time.sleep(0.05)

        before = s.rss()
        peak = [before]

        def watch():
            while not stop.is_set():
                peak.append(s.rss())
                time.sleep(0.02)

        threads = [threading.Thread(target=poll), threading.Thread(target=watch)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        t0 = time.perf_counter()
        r = httpx.post(f"{s.url}/v1/audio/voices", timeout=600, files={"audio_sample": ("silence.flac", data)},
                       data={"name": "bomb", "text": "silence"})
        took = time.perf_counter() - t0
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join()
    return {"flac_bytes": len(data), "flac_seconds": secs, "status": r.status_code, "upload_s": took,
            "message": (r.json().get("error") or {}).get("message", "")[:200] if r.status_code != 200 else None,
            "health_max_s": max(lat), "health_median_s": statistics.median(lat), "health_polls": len(lat),
            "rss_before_kib": before, "rss_peak_kib": max(peak), "rss_rise_mib": (max(peak) - before) / 1024}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", type=Path, default=Path("artifacts/kokoro-tiny"))
    ap.add_argument("--fish-model-dir", type=Path, default=None)
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--code", type=Path, default=None, help="serve from this checkout (PYTHONPATH)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--blend-terms", default="16,4000", help="blend sizes to time")
    ap.add_argument("-o", "--output", type=Path, default=None)
    args = ap.parse_args(argv)
    # a kill (SIGTERM) unwinds like Ctrl-C, so each `with Server` stops the server it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    out = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
           "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with Server(args, args.model_dir) as s:
        out["model"], out["backend"] = s.model, s.health["backend"]
        voices = httpx.get(f"{s.url}/v1/audio/voices").json()["voices"]
        out["first_request"] = first_vs_warm(s, voices[0])
        print(json.dumps(out["first_request"]), flush=True)
        out["mixed"] = mixed(s, voices, args.requests)
        out["blend"] = blends(s, voices, [int(x) for x in args.blend_terms.split(",")])
    out["throughput"] = [throughput(args, args.model_dir, voices[0], w) for w in (1, 2)]
    print(json.dumps(out["throughput"]), flush=True)
    if args.fish_model_dir:
        out["upload"] = upload_bomb(args)
        print(json.dumps(out["upload"]), flush=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
