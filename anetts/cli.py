"""``anetts`` command line: ``anetts speak "text" -o out.wav``, ``anetts serve``, ``anetts publish ...``, ``anetts run-mil ...``."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
import time
from pathlib import Path

from anetts.artifacts import HF_SCHEME, atomic_file
from anetts.loader import DEFAULT_MODEL_DIR
from anetts.models.fish.prefix import DEFAULT_MB as PREFIX_CACHE_MB
from anetts.runtime.runners import COMPUTE_UNITS, EXECUTORS
from anetts.serve import config as SV

# speak options that go to the runtime's `stream` as they are; each runtime lists those it takes
# (`options`), and one given to a model that takes no such option is refused by name, not dropped
STREAM_OPTIONS = ("phonemes", "lang", "temperature", "top_p", "top_k", "max_frames")
# sub-commands with parsers of their own: name -> (module with `main(argv)`, help)
PASSED_THROUGH = {
    "run-mil": ("anetts.mil.cli", "run an .mlpackage with the MIL reference executor"),
    "inspect": ("anetts.compile.inspect", "op histogram, weights, I/O and static ANE lint of an .mlpackage"),
    "bench": ("anetts.bench", "benchmark a built model on this machine: load, first-call and warm times, end-to-end "
                              "RTF, upstream side by side"),
    "listen": ("anetts.listen.cli", "judge a build, or folders of wavs, by listening: words, voice, quality, pitch "
                                    "against upstream's own variation"),
    "report": ("anetts.report", "render <model-dir>/report.html from a built model"),
    "verify": ("anetts.verify.files", "re-check every manifested file's sha256; --repair removes bad ones so "
                                      "`snakemake all` rebuilds them"),
}
# speak options a capability of the runtime (anetts.runtime.speech.Capabilities) must allow
CAPABILITY_OPTIONS = {"speed": "speed", "timestamps": "timestamps", "reference_audio": "cloning",
                      "reference_codes": "cloning", "reference_text": "cloning"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="anetts", description="ane-tts: text-to-speech from built CoreML/TorchScript artifacts")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    s = sub.add_parser("speak", help="synthesize text (or phonemes) to a wav at the model's rate",
                       description="Synthesize text to a mono wav at the model's rate (Kokoro 24 kHz, Fish 44.1 kHz) "
                                   "with a built model; options a model does not take are refused by name.")
    s.add_argument("text", nargs="?", help="text to speak; '-' reads stdin (or pass --phonemes)")
    s.add_argument("-o", "--output", required=True, type=Path, help="output .wav path")
    s.add_argument("--voice", default=None, help="voice name (default: af_heart if built, else the first voice)")
    s.add_argument("--speed", type=float, default=None, help="speaking rate, 0.25..4 (default 1)")
    s.add_argument("--backend", choices=EXECUTORS, default=None,
                   help="torch (TorchScript exports; default off macOS), coreml (macOS, default there), mil "
                        "(reference executor on the packages; default off macOS for a compressed variant) or "
                        "coreai (.aimodel assets)")
    s.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR, help=f"built model directory (default {DEFAULT_MODEL_DIR})")
    s.add_argument("--model", default=None, metavar="DIR|hf://OWNER/REPO@REV",
                   help="a model directory or a published model (downloaded, verified, cached); overrides --model-dir")
    s.add_argument("--phonemes", default=None, help="speak these phonemes instead of text (skips G2P)")
    s.add_argument("--lang", default=None,
                   help="G2P language, upstream Kokoro's code or alias: a/en-us, b/en-gb, e/es, f/fr-fr, h/hi, i/it, "
                        "p/pt-br, j/ja, z/zh (default: the voice's first letter, e.g. jf_alpha -> j; else a)")
    s.add_argument("--timestamps", type=Path, default=None, metavar="FILE.json|.srt|.vtt",
                   help="Kokoro: also write word timestamps (format from the suffix)")
    s.add_argument("--seed", type=int, default=0, help="seed of the hn-NSF noise (default 0)")
    s.add_argument("--threads", type=int, default=None, help="torch threads (torch and mil backends)")
    s.add_argument("--deployment-target", default=None, metavar="OS",
                   help="oldest OS to support, e.g. macOS14; from macOS15/iOS18 on stages run from their "
                        "multifunction bundles (coreml and mil backends), otherwise per-bucket packages")
    s.add_argument("--compute-units", default=None, choices=COMPUTE_UNITS,
                   help="Core ML compute units for every stage (coreml backend; default: per stage from the manifest)")
    s.add_argument("--reference-codes", type=Path, default=None, metavar="NPY",
                   help="Fish: codes (10, frames) of the reference audio, as .npy (the voice to clone)")
    s.add_argument("--reference-audio", type=Path, default=None, metavar="WAV",
                   help="Fish: the reference clip itself (44.1 kHz, <= 30 s), encoded on the host by upstream's "
                        "codec encoder; instead of --reference-codes")
    s.add_argument("--reference-text", default=None, help="Fish: transcript of the reference audio")
    s.add_argument("--temperature", type=float, default=None, help="Fish: sampling temperature; 0 = greedy (default 0.7)")
    s.add_argument("--top-p", type=float, default=None, help="Fish: top-p (default 0.7)")
    s.add_argument("--top-k", type=int, default=None, help="Fish: top-k (default 30)")
    s.add_argument("--max-frames", type=int, default=None, help="Fish: most frames per text chunk (46.44 ms each)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.add_argument("-v", "--verbose", action="store_true", help="log more")
    s.set_defaults(func=_speak)

    # no abbreviations: `--api-key` (the flag that put keys in argv) must not be read as `--api-key-file`
    sv = sub.add_parser("serve", allow_abbrev=False, help="serve OpenAI's speech API (/v1/audio/speech) over a built model",
                        description="An OpenAI-compatible speech server over a built model (needs the `serve` "
                                    "extra): POST /v1/audio/speech, GET /v1/audio/voices, /v1/models, /health, "
                                    "and a page at / that speaks while it streams.")
    sv.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR, help=f"built model directory (default {DEFAULT_MODEL_DIR})")
    sv.add_argument("--backend", choices=EXECUTORS, default=None, help="as for speak")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    sv.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    sv.add_argument("--api-key-file", type=Path, default=None, metavar="FILE",
                    help="require 'Authorization: Bearer KEY' on /v1, KEY one of the keys in FILE (one per line); "
                         "without it, the key in $ANETTS_API_KEY if set, else no key (a single-user server)")
    sv.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                    help="a Host name clients may reach the server by, besides the loopback names and the bound "
                         "address (repeatable; needed behind a DNS name)")
    sv.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                    help="allow browser pages from ORIGIN to call the API (repeatable; default: only the server's "
                         "own page)")
    sv.add_argument("--workers", type=int, default=1, help="model instances, each serving one request at a time (default 1)")
    sv.add_argument("--queue", type=int, default=SV.QUEUE,
                    help=f"requests that may wait for a worker; more get 429 (default {SV.QUEUE})")
    sv.add_argument("--timeout", type=float, default=SV.TIMEOUT_S,
                    help=f"seconds per request, waiting included (default {SV.TIMEOUT_S:g})")
    sv.add_argument("--max-body-bytes", type=int, default=SV.MAX_BODY_BYTES,
                    help=f"largest request body (default {SV.MAX_BODY_BYTES >> 20} MiB)")
    sv.add_argument("--max-input-chars", type=int, default=SV.MAX_INPUT_CHARS,
                    help=f"longest input text (default {SV.MAX_INPUT_CHARS}, OpenAI's)")
    sv.add_argument("--max-frames", type=int, default=None, help="Fish: most frames per text chunk (46.44 ms each)")
    sv.add_argument("--header-timeout", type=float, default=SV.HEADER_TIMEOUT_S,
                    help=f"seconds a client may take to send a request's head (default {SV.HEADER_TIMEOUT_S:g})")
    sv.add_argument("--threads", type=int, default=None, help="torch threads (torch and mil backends)")
    sv.add_argument("--voice-dir", type=Path, default=None, metavar="DIR",
                    help="keep cloned voices (Fish) in DIR, one checksummed file each, across restarts (default: "
                         "in memory, gone when the server stops)")
    sv.add_argument("--max-voices", type=int, default=SV.MAX_VOICES,
                    help=f"cloned voices per owner (API key) (default {SV.MAX_VOICES}, OpenAI's)")
    sv.add_argument("--max-voice-bytes", type=int, default=SV.MAX_VOICE_BYTES,
                    help=f"bytes of the whole voice store (default {SV.MAX_VOICE_BYTES >> 20} MiB)")
    sv.add_argument("--prefix-cache-mb", type=int, default=None, metavar="MB",
                    help="Fish: MiB of prefilled voice prompts, shared by the workers (a cloned voice's system turn prefilled "
                         f"once, at registration or start, not in every request; 0: none kept; default "
                         f"{PREFIX_CACHE_MB}: a snapshot of S2 Pro is 144 MiB on Core ML or mil, 288 MiB on torch)")
    sv.add_argument("-v", "--verbose", action="store_true", help="log more")
    sv.set_defaults(func=_serve)

    vo = sub.add_parser("voices", allow_abbrev=False, help="list, add and delete cloned voices on a running server",
                        description="Cloned voices (Fish) of a running `anetts serve`: list them, register a "
                                    "reference clip, delete one. The key (if the server wants one) comes from "
                                    "--api-key-file or $ANETTS_API_KEY, never the command line.")
    vsub = vo.add_subparsers(dest="voices_command", required=True)
    for name, what in (("list", "the built voices and your cloned ones"), ("add", "register a reference clip"),
                       ("delete", "delete one of your cloned voices")):
        v = vsub.add_parser(name, allow_abbrev=False, help=what)
        v.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default http://127.0.0.1:8000)")
        v.add_argument("--api-key-file", type=Path, default=None, metavar="FILE",
                       help="the key to send: the first in FILE (default: $ANETTS_API_KEY, if set)")
        v.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the answer (default 300)")
        if name == "add":
            v.add_argument("clip", type=Path, help="the reference clip (wav, flac or ogg at the model's rate)")
            v.add_argument("--name", required=True, help="the voice's name")
            v.add_argument("--text", required=True, help="the clip's transcript")
            v.add_argument("--consent", default=None, help="a consent note, kept with the voice")
        if name == "delete":
            v.add_argument("voice_id", help="the voice's id (voice_...)")
    vo.set_defaults(func=_voices)

    for name, (module, help_text) in PASSED_THROUGH.items():  # their own parsers read everything after the name
        passed = sub.add_parser(name, help=f"{help_text} ({module})", add_help=False)
        passed.add_argument("args", nargs=argparse.REMAINDER)
        passed.set_defaults(func=lambda args, module=module: _delegate(module, args.args))

    u = sub.add_parser("publish", help="publish a verified build to the Hugging Face Hub in one commit",
                       description="Gate (parity passed, sha256 as in the manifest), stage the Hub tree under "
                                   "MODEL_DIR/publish/tree, then commit it to REPO_ID in one atomic commit "
                                   "(token: HF_TOKEN or `hf auth login`; endpoint: HF_ENDPOINT).")
    u.add_argument("--model-dir", type=Path, required=True, help="built model directory (artifacts/<model>)")
    u.add_argument("--repo-id", required=True, help="OWNER/NAME of the Hub model repo (created if missing)")
    u.add_argument("--revision", default="main", help="branch to commit to (default main)")
    u.add_argument("--private", action="store_true", help="create the repo private (ignored if it exists)")
    u.add_argument("--dry-run", action="store_true", help="stage and print what would be added, changed, deleted "
                                                           "and the model card; send nothing")
    u.set_defaults(func=_publish)
    return p


def _publish(args) -> int:
    from anetts.publish import PublishError, publish, publish_dir

    try:
        record = publish(args.model_dir, args.repo_id, revision=args.revision, private=args.private,
                         dry_run=args.dry_run)
    except PublishError as e:
        print(f"anetts publish: error: {e}", file=sys.stderr)
        return 1
    if args.dry_run:
        print("---- README.md (model card) ----")
        print((publish_dir(args.model_dir) / "tree" / "README.md").read_text(encoding="utf-8"))
    else:
        print(f"published: {record['load']} (recorded in {publish_dir(args.model_dir) / 'published.json'})")
    return 0


def _given(args, names) -> dict:
    """The options among `names` given on the command line, as keyword arguments."""
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _foreign_options(args, tts) -> list[str]:
    """The options given that this model does not take (its ``options``, its capabilities)."""
    foreign = [n for n in _given(args, STREAM_OPTIONS) if n not in tts.options]
    foreign += [n for n, cap in CAPABILITY_OPTIONS.items()
                if getattr(args, n) is not None and not getattr(tts.capabilities, cap)]
    return [_flag(n) for n in sorted(set(foreign), key=list(vars(args)).index)]


def _cloned_voice(args, tts):
    """A voice cloned from --reference-audio or --reference-codes (with --reference-text), or None."""
    import numpy as np
    import soundfile as sf

    if args.reference_audio is None and args.reference_codes is None:
        if args.reference_text is not None:
            raise _Usage("--reference-text needs --reference-audio or --reference-codes")
        return None
    if args.reference_audio is not None and args.reference_codes is not None:
        raise _Usage("give --reference-audio or --reference-codes, not both")
    if args.voice is not None:
        raise _Usage("give --voice or a reference clip, not both")
    if args.reference_codes is not None:
        try:
            return tts.make_voice(args.reference_text or "", codes=np.load(args.reference_codes, allow_pickle=False))
        except (OSError, ValueError) as e:
            if getattr(e, "field", None):
                raise
            raise _Failed(f"cannot read --reference-codes {args.reference_codes}: {e}") from None
    try:
        clip, rate = sf.read(str(args.reference_audio), dtype="float32", always_2d=False)
    except (OSError, RuntimeError) as e:  # soundfile's LibsndfileError is a RuntimeError
        raise _Failed(f"cannot read --reference-audio {args.reference_audio}: {e}") from None
    return tts.make_voice(args.reference_text or "", audio=clip, rate=rate)


class _Usage(Exception):
    """A command-line mistake: exit 2."""


class _Failed(Exception):
    """A failure that is not the runtime's: exit 1."""


def _speak(args) -> int:
    """Text -> the model's chunks (runtime protocol, anetts.runtime.speech) -> a wav, or the codes as .npy
    where the build makes codes only; word timestamps where the model gives them."""
    from anetts.loader import load
    from anetts.runtime import InputError, TTSError
    from anetts.runtime.captions import CAPTION_SUFFIXES

    def error(message: str, rc: int) -> int:
        print(f"anetts speak: error: {message}", file=sys.stderr)
        return rc

    text = args.text
    if text == "-":
        text = sys.stdin.read()
    if (text is None) == (args.phonemes is None):
        return error("give either TEXT or --phonemes (exactly one)", 2)
    if args.timestamps is not None and args.timestamps.suffix.lower() not in CAPTION_SUFFIXES:
        return error(f"--timestamps must end in one of {', '.join(CAPTION_SUFFIXES)}, got {args.timestamps}", 2)
    if args.output.suffix.lower() not in (".wav", ".npy"):
        return error(f"output must be a .wav file (or .npy for a model's codes), got {args.output}", 2)
    given = _given(args, STREAM_OPTIONS)
    try:
        model = args.model if args.model is not None else args.model_dir
        if isinstance(model, str) and not model.startswith(HF_SCHEME):
            model = Path(model)
        tts = load(model, backend=args.backend, threads=args.threads, compute_units=args.compute_units,
                   deployment_target=args.deployment_target)
        foreign = _foreign_options(args, tts)
        if foreign:
            return error(f"{', '.join(foreign)} {'does' if len(foreign) == 1 else 'do'} not apply to this "
                         f"{tts.family} model", 2)
        voice = _cloned_voice(args, tts) or args.voice
        speed = {} if args.speed is None else {"speed": args.speed}
        t0 = time.perf_counter()
        chunks = tts.stream(text, voice, seed=args.seed, **speed, **given)
        audio, codes, words, timings, bar = [], [], [], {}, None
        if not args.no_progress:
            from tqdm import tqdm

            bar = tqdm(total=chunks.units, unit=chunks.unit, desc="speak", file=sys.stderr)
        for chunk in chunks:
            if bar is not None:
                bar.update(chunk.units)
            if chunk.audio is not None:
                audio.append(chunk.audio)
            if chunk.codes is not None:
                codes.append(chunk.codes)
            words += chunk.words
            for k, v in (chunk.timings or {}).items():
                timings[k] = timings.get(k, 0.0) + v
        if bar is not None:
            bar.close()
        total = time.perf_counter() - t0
    except _Usage as e:
        return error(str(e), 2)
    except _Failed as e:
        return error(str(e), 1)
    except InputError as e:  # about an option given on the command line: a usage error naming it
        name = getattr(e, "field", None)
        if name in given or (name == "speed" and args.speed is not None):
            return error(f"{_flag(name)}: {e}", 2)
        return error(str(e), 1)
    except TTSError as e:
        return error(str(e), 1)
    return _write_speech(args, tts, audio, codes, words, timings, total)


def _write_speech(args, tts, audio: list, codes: list, words: list, timings: dict, total: float) -> int:
    """The wav (or the codes, where the build makes no audio) and the timestamps file, each written whole."""
    import numpy as np
    import soundfile as sf

    from anetts.runtime.captions import format_timestamps

    wav = tts.capabilities.audio and args.output.suffix.lower() == ".wav"
    out = args.output if wav else args.output.with_suffix(".npy")
    if not wav and not codes:
        print(f"anetts speak: error: this {tts.family} model makes audio, not codes: write a .wav", file=sys.stderr)
        return 2
    data = np.concatenate(audio) if wav else np.concatenate(codes)
    if wav and data.size == 0:  # never write a silent empty wav
        print("anetts speak: error: synthesis produced no audio", file=sys.stderr)
        return 1
    try:
        with atomic_file(out) as tmp:  # a full disk leaves no short file, and an old file as it was
            if wav:
                sf.write(str(tmp), data, tts.sample_rate, subtype="FLOAT")
            else:
                np.save(tmp, data)
        if args.timestamps is not None:
            with atomic_file(args.timestamps) as tmp:
                tmp.write_text(format_timestamps(words, args.timestamps.suffix), encoding="utf-8")
    except (OSError, RuntimeError) as e:  # soundfile's LibsndfileError is a RuntimeError
        print(f"anetts speak: error: cannot write {out}: {e}", file=sys.stderr)
        return 1
    if args.timestamps is not None and not words:
        print(f"anetts speak: note: no word timestamps in {args.timestamps} (phonemes given, or a language whose "
              "frontend has no words)", file=sys.stderr)
    how = f"in {total:.2f} s ({len(audio) or len(codes)} chunk(s), backend {tts.backend.name})"
    if wav:
        seconds = data.shape[0] / tts.sample_rate
        print(f"wrote {out}: {seconds:.2f} s of audio at {tts.sample_rate} Hz {how}, RTF {total / seconds:.3f}")
    else:
        why = "" if tts.capabilities.audio else "this build has no codec stage, so no audio; "
        print(f"wrote {out}: codes {data.shape} {data.dtype} ({why}{how})")
    if args.verbose:
        print("timings: " + ", ".join(f"{k} {v:.2f}s" for k, v in timings.items() if k != "total"))
    return 0


def _serve(args) -> int:
    try:
        from anetts.serve import ServeConfig, run
        from anetts.serve.guard import read_keys
    except ImportError as e:
        print(f"anetts serve: error: {e.name or e} is missing; install the serve extra: pip install 'ane-tts[serve]'",
              file=sys.stderr)
        return 1
    from anetts.runtime import TTSError

    bad = [f"--{k.replace('_', '-')} must be >= {lo}, got {v}" for k, v, lo in
           (("workers", args.workers, 1), ("queue", args.queue, 0), ("timeout", args.timeout, 0.001),
            ("max_body_bytes", args.max_body_bytes, 1), ("max_input_chars", args.max_input_chars, 1),
            ("port", args.port, 0), ("max_frames", args.max_frames or 1, 1),
            ("header_timeout", args.header_timeout, 0.001), ("max_voices", args.max_voices, 0),
            ("max_voice_bytes", args.max_voice_bytes, 0),
            ("prefix_cache_mb", 0 if args.prefix_cache_mb is None else args.prefix_cache_mb, 0)) if v < lo]
    if bad:
        print(f"anetts serve: error: {bad[0]}", file=sys.stderr)
        return 2
    try:
        keys = read_keys(args.api_key_file)
    except ValueError as e:
        print(f"anetts serve: error: {e}", file=sys.stderr)
        return 2
    config = ServeConfig(args.model_dir, backend=args.backend, workers=args.workers, queue=args.queue,
                         timeout=args.timeout, api_keys=keys, host=args.host, allowed_hosts=args.allowed_host,
                         cors_origins=args.cors_origin, max_body_bytes=args.max_body_bytes,
                         max_input_chars=args.max_input_chars, max_frames=args.max_frames, threads=args.threads,
                         header_timeout=args.header_timeout, voice_dir=args.voice_dir, max_voices=args.max_voices,
                         max_voice_bytes=args.max_voice_bytes, prefix_cache_mb=args.prefix_cache_mb)
    try:
        run(config, port=args.port, log_level="info" if args.verbose else "warning")
    except TTSError as e:
        print(f"anetts serve: error: {e}", file=sys.stderr)
        return 1
    return 0


def _voices(args) -> int:
    import httpx

    from anetts.serve.guard import read_keys

    try:
        keys = read_keys(args.api_key_file)
    except ValueError as e:
        print(f"anetts voices: error: {e}", file=sys.stderr)
        return 2
    headers = {"Authorization": f"Bearer {keys[0]}"} if keys else {}
    base = args.url.rstrip("/") + "/v1/audio/voices"
    try:
        with httpx.Client(headers=headers, timeout=args.timeout) as client:
            if args.voices_command == "list":
                r = client.get(base)
            elif args.voices_command == "add":
                try:
                    data = args.clip.read_bytes()
                except OSError as e:
                    print(f"anetts voices: error: cannot read {args.clip}: {e.strerror}", file=sys.stderr)
                    return 2
                form = {"name": args.name, "text": args.text, **({"consent": args.consent} if args.consent else {})}
                r = client.post(base, files={"audio_sample": (args.clip.name, data)}, data=form)
            else:
                r = client.delete(f"{base}/{args.voice_id}")
    except httpx.HTTPError as e:
        print(f"anetts voices: error: {args.url}: {e}", file=sys.stderr)
        return 1
    try:
        body = r.json()
    except ValueError:
        body = None
    if r.status_code >= 400 or not isinstance(body, dict):
        msg = body.get("error", {}).get("message") if isinstance(body, dict) else None
        print(f"anetts voices: error: {r.status_code} {msg or r.text[:200]}", file=sys.stderr)
        return 1
    if args.voices_command == "list":
        cloned = {v["id"] for v in body.get("data", [])}
        for v in body.get("data", []):
            print(f"{v['id']}\t{v['name']}\t{v['created_at']}")
        for name in body.get("voices", []):
            if name not in cloned:
                print(f"{name}\t(built)")
    elif args.voices_command == "add":
        print(f"{body['id']}\t{body['name']}\t{body['created_at']}")
    else:
        print(f"deleted {body['id']}")
    return 0


def _delegate(module: str, argv: list[str]) -> int:
    sub_cli = importlib.import_module(module)  # part of this package: an import error is a bug, shown as one
    try:
        rc = sub_cli.main(list(argv))
    except SystemExit as e:  # its argparse: usage errors and --help
        rc = e.code
    return int(rc or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if argv[:1] and argv[0] in PASSED_THROUGH:  # everything after the name is the sub-command's, --help included
        return _delegate(PASSED_THROUGH[argv[0]][0], argv[1:])
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: usage errors (2) and --help (0) as a return code
        return int(e.code or 0)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
