"""``anetts`` command line: ``anetts speak "text" -o out.wav``, ``anetts serve``, ``anetts publish ...``, ``anetts run-mil ...``."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path

from anetts.artifacts import atomic_file
from anetts.loader import DEFAULT_MODEL_DIR, HF_SCHEME
from anetts.runtime.runners import COMPUTE_UNITS, EXECUTORS
from anetts.serve import config as SV

# speak options only one family reads (default None: the runtime's default applies); given to a
# model of the other family they are refused by name instead of silently ignored
KOKORO_ONLY = ("voice", "speed", "lang")
FISH_ONLY = ("reference_codes", "reference_audio", "reference_text", "temperature", "top_p", "top_k", "max_frames")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="anetts", description="ane-tts: text-to-speech from built CoreML/TorchScript artifacts")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    s = sub.add_parser("speak", help="synthesize text (or phonemes) to a 24 kHz wav",
                       description="Synthesize text to a 24 kHz mono wav with a built model.")
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
    sv.add_argument("-v", "--verbose", action="store_true", help="log more")
    sv.set_defaults(func=_serve)

    m = sub.add_parser("run-mil", help="run an .mlpackage with the MIL reference executor (anetts.mil.cli)",
                       add_help=False)
    m.add_argument("args", nargs=argparse.REMAINDER)
    m.set_defaults(func=_run_mil)

    i = sub.add_parser("inspect", help="op histogram, weights, I/O and static ANE lint of an .mlpackage "
                                       "(anetts.compile.inspect)", add_help=False)
    i.add_argument("args", nargs=argparse.REMAINDER)
    i.set_defaults(func=_inspect)

    b = sub.add_parser("bench", help="benchmark a built model on this machine: load, first-call and warm times, "
                                     "end-to-end RTF, upstream side by side (anetts.bench)", add_help=False)
    b.add_argument("args", nargs=argparse.REMAINDER)
    b.set_defaults(func=_bench)

    li = sub.add_parser("listen", help="judge a build, or folders of wavs, by listening: words, voice, quality, "
                                       "pitch against upstream's own variation (anetts.listen)", add_help=False)
    li.add_argument("args", nargs=argparse.REMAINDER)
    li.set_defaults(func=_listen)

    r = sub.add_parser("report", help="render <model-dir>/report.html from a built model (anetts.report)", add_help=False)
    r.add_argument("args", nargs=argparse.REMAINDER)
    r.set_defaults(func=_report)

    v = sub.add_parser("verify", help="re-check every manifested file's sha256; --repair removes bad ones so "
                                      "`snakemake all` rebuilds them (anetts.verify.files)", add_help=False)
    v.add_argument("args", nargs=argparse.REMAINDER)
    v.set_defaults(func=_verify)

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


def _refuse_options_of_other_family(args, names, family) -> bool:
    given = [f"--{n.replace('_', '-')}" for n in _given(args, names)]
    if given:
        print(f"anetts speak: error: {', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to "
              f"this {family} model ({'Fish' if family == 'kokoro' else 'Kokoro'} options)", file=sys.stderr)
    return bool(given)


def _speak(args) -> int:
    import numpy as np
    import soundfile as sf

    from anetts.loader import load
    from anetts.runtime import TTSError

    text = args.text
    if text == "-":
        text = sys.stdin.read()
    if (text is None) == (args.phonemes is None):
        print("anetts speak: error: give either TEXT or --phonemes (exactly one)", file=sys.stderr)
        return 2
    if args.timestamps is not None or args.lang is not None:
        from anetts.models.kokoro.frontend import lang_code
        from anetts.models.kokoro.timestamps import CAPTION_SUFFIXES

        if args.timestamps is not None and args.timestamps.suffix.lower() not in CAPTION_SUFFIXES:
            print(f"anetts speak: error: --timestamps must end in one of {', '.join(CAPTION_SUFFIXES)}, got "
                  f"{args.timestamps}", file=sys.stderr)
            return 2
        if args.lang is not None:
            try:
                lang_code(args.lang)
            except TTSError as e:
                print(f"anetts speak: error: --lang: {e}", file=sys.stderr)
                return 2
    if args.output.suffix.lower() not in (".wav", ".npy"):
        print(f"anetts speak: error: output must be a .wav file (or .npy for Fish codes), got {args.output}",
              file=sys.stderr)
        return 2
    try:
        model = args.model if args.model is not None else args.model_dir
        if isinstance(model, str) and not model.startswith(HF_SCHEME):
            model = Path(model)
        tts = load(model, backend=args.backend, threads=args.threads, compute_units=args.compute_units,
                   deployment_target=args.deployment_target)
        if getattr(tts, "family", None) == "fish":
            if args.timestamps is not None:
                print("anetts speak: error: --timestamps is for Kokoro models (Fish has no word alignment)", file=sys.stderr)
                return 2
            return 2 if _refuse_options_of_other_family(args, KOKORO_ONLY, "fish") else _speak_fish(args, tts, text)
        if _refuse_options_of_other_family(args, FISH_ONLY, "kokoro"):
            return 2
        if args.output.suffix.lower() != ".wav":
            print(f"anetts speak: error: output must be a .wav file, got {args.output}", file=sys.stderr)
            return 2
        chunks = tts.stream(text, phonemes=args.phonemes, seed=args.seed, **_given(args, KOKORO_ONLY))
        parts, timings, bar, words = [], {}, None, []
        for chunk in chunks:
            if bar is None and chunk.total > 1 and not args.no_progress:
                from tqdm import tqdm

                bar = tqdm(total=chunk.total, unit="chunk", desc="speak", file=sys.stderr)
            if bar is not None:
                bar.total = chunk.total
                bar.update(1)
            parts.append(chunk.audio)
            words += chunk.words
            for k, v in chunk.timings.items():
                timings[k] = timings.get(k, 0.0) + v
        if bar is not None:
            bar.close()
    except TTSError as e:
        print(f"anetts speak: error: {e}", file=sys.stderr)
        return 1
    audio = np.concatenate(parts)
    if audio.size == 0:  # cannot happen (every chunk has >= 1 frame), but never write a silent empty wav
        print("anetts speak: error: synthesis produced no audio", file=sys.stderr)
        return 1
    try:
        with atomic_file(args.output) as tmp:  # a full disk leaves no short wav, and an old file as it was
            sf.write(str(tmp), audio, tts.sample_rate, subtype="FLOAT")
    except (OSError, RuntimeError) as e:  # soundfile's LibsndfileError is a RuntimeError
        print(f"anetts speak: error: cannot write {args.output}: {e}", file=sys.stderr)
        return 1
    if args.timestamps is not None:
        from anetts.models.kokoro.timestamps import format_timestamps

        try:
            with atomic_file(args.timestamps) as tmp:
                tmp.write_text(format_timestamps(words, args.timestamps.suffix), encoding="utf-8")
        except OSError as e:
            print(f"anetts speak: error: cannot write {args.timestamps}: {e}", file=sys.stderr)
            return 1
        if not words:
            print(f"anetts speak: note: no word timestamps in {args.timestamps} (phonemes given, or a language whose "
                  "frontend has no words)", file=sys.stderr)
    seconds = audio.shape[0] / tts.sample_rate
    total = timings.get("total", 0.0)
    stages = ", ".join(f"{k} {v:.2f}s" for k, v in timings.items() if k != "total")
    print(f"wrote {args.output}: {seconds:.2f} s of audio at {tts.sample_rate} Hz in {total:.2f} s "
          f"(RTF {total / seconds:.3f}, backend {tts.backend.name}, {len(parts)} chunk(s))")
    if args.verbose:
        print(f"timings: {stages}")
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
            ("header_timeout", args.header_timeout, 0.001)) if v < lo]
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
                         header_timeout=args.header_timeout)
    try:
        run(config, port=args.port, log_level="info" if args.verbose else "warning")
    except TTSError as e:
        print(f"anetts serve: error: {e}", file=sys.stderr)
        return 1
    return 0


def _speak_fish(args, tts, text) -> int:
    """Fish: text -> codes -> audio; a wav when the build has a codec stage, else the codes as .npy."""
    import numpy as np
    import soundfile as sf

    from anetts.runtime import InputError, TTSError

    if text is None:
        print("anetts speak: error: Fish speaks text; --phonemes is Kokoro's", file=sys.stderr)
        return 2
    ref = None
    if args.reference_codes is not None:
        try:
            ref = np.load(args.reference_codes, allow_pickle=False)
        except (OSError, ValueError) as e:
            print(f"anetts speak: error: cannot read --reference-codes {args.reference_codes}: {e}", file=sys.stderr)
            return 1
    if args.reference_audio is not None:
        if ref is not None:
            print("anetts speak: error: give --reference-audio or --reference-codes, not both", file=sys.stderr)
            return 2
        try:
            clip, rate = sf.read(str(args.reference_audio), dtype="float32", always_2d=False)
        except (OSError, RuntimeError) as e:  # soundfile's LibsndfileError is a RuntimeError
            print(f"anetts speak: error: cannot read --reference-audio {args.reference_audio}: {e}", file=sys.stderr)
            return 1
        try:
            ref = tts.encode_reference(clip, rate)
        except TTSError as e:
            print(f"anetts speak: error: --reference-audio {args.reference_audio}: {e}", file=sys.stderr)
            return 1
    try:
        blocks = tts.stream(text, reference_text=args.reference_text, reference_codes=ref, seed=args.seed,
                            max_frames=args.max_frames, **_given(args, ("temperature", "top_p", "top_k")))
        codes, audio, bar, stops, first, total = [], [], None, [], None, 0.0
        for b in blocks:
            if not args.no_progress and bar is None:
                from tqdm import tqdm

                bar = tqdm(unit="frame", desc="speak", file=sys.stderr)
            first = b.elapsed if first is None else first
            codes.append(b.codes)
            if b.audio is not None:
                audio.append(b.audio)
            if bar is not None:
                bar.update(len(b.codes))
                bar.set_postfix_str(f"{b.frames_total * 2048 / tts.sample_rate:.2f} s audio, chunk {b.chunk + 1}")
            if b.is_chunk_end:
                stops.append(b.stop)
            total = b.elapsed
        if bar is not None:
            bar.close()
    except (TTSError, InputError) as e:
        print(f"anetts speak: error: {e}", file=sys.stderr)
        return 1
    codes = np.concatenate(codes).reshape(-1, 10) if codes else np.zeros((0, 10), np.int64)
    seconds = codes.shape[0] * 2048 / tts.sample_rate
    how = (f"{codes.shape[0]} frames in {total:.2f} s ({len(stops)} chunk(s), stops {stops}, "
           f"first block at {first or 0:.2f} s, backend {tts.backend.name})")
    try:
        if tts.has_codec and args.output.suffix.lower() == ".wav":
            with atomic_file(args.output) as tmp:
                sf.write(str(tmp), np.concatenate(audio), tts.sample_rate, subtype="FLOAT")
            print(f"wrote {args.output}: {seconds:.2f} s of audio at {tts.sample_rate} Hz, {how}")
        else:
            out = args.output.with_suffix(".npy")
            with atomic_file(out) as tmp:
                np.save(tmp, codes)
            why = "this build has no codec stage, so no audio; " if not tts.has_codec else ""
            print(f"wrote {out}: codes ({codes.shape[0]}, 10) int64 = {seconds:.2f} s of speech once decoded "
                  f"({why}{how})")
    except (OSError, RuntimeError) as e:
        print(f"anetts speak: error: cannot write {args.output}: {e}", file=sys.stderr)
        return 1
    return 0


def _delegate(module: str, command: str, argv: list[str]) -> int:
    sub_cli = importlib.import_module(module)  # part of this package: an import error is a bug, shown as one
    try:
        rc = sub_cli.main(list(argv))
    except SystemExit as e:  # its argparse: usage errors and --help
        rc = e.code
    return int(rc or 0)


def _run_mil(args) -> int:
    return _delegate("anetts.mil.cli", "run-mil", args.args)


def _verify(args) -> int:
    return _delegate("anetts.verify.files", "verify", args.args)


def _inspect(args) -> int:
    return _delegate("anetts.compile.inspect", "inspect", args.args)


def _bench(args) -> int:
    return _delegate("anetts.bench", "bench", args.args)


def _report(args) -> int:
    return _delegate("anetts.report", "report", args.args)


def _listen(args) -> int:
    return _delegate("anetts.listen.cli", "listen", args.args)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    passed_through = {"run-mil": _run_mil, "inspect": _inspect, "bench": _bench, "report": _report, "verify": _verify,
                      "listen": _listen}
    if argv[:1] and argv[0] in passed_through:  # everything after the name is the sub-command's, --help included
        return passed_through[argv[0]](argparse.Namespace(args=argv[1:]))
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: usage errors (2) and --help (0) as a return code
        return int(e.code or 0)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
