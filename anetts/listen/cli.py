"""``anetts listen``: judge a build, or folders of wavs, as the listener gate does; the verdict as JSON.

    anetts listen --model-dir artifacts/kokoro-82m-onnx [--backend mil] [--limit 5] -o listen.json
    anetts listen --reference up0/ --floor up1/ --candidate build/ --model kokoro-82m-onnx -o listen.json

A build is rendered and judged with its model's ``listen`` block of ``config.yaml`` (voices, seeds,
margins; ``--config`` for another file, ``--model`` for another entry than the manifest's model). Folders
hold ``<language>/<name>.wav`` (``en``, ``ja``: Whisper's language), matched by path across the three;
without ``--floor`` the report has the candidate's measures and no verdict. Exit 0 when the gate holds
(or there is none), 1 when it fails, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)


def _settings(config_path: Path, model: str) -> dict:
    import yaml

    try:
        config = yaml.safe_load(Path(config_path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"cannot read {config_path}: {e}") from None
    block = ((config or {}).get("models") or {}).get(model, {}).get("listen")
    if not block:
        raise ValueError(f"{config_path}: model {model!r} has no `listen` block (voices and margins)")
    return block


def _folder(path: Path) -> dict[str, Path]:
    files = {p.relative_to(path).as_posix(): p for p in sorted(Path(path).glob("*/*.wav"))}
    if not files:
        raise ValueError(f"{path}: no <language>/<name>.wav files")
    return files


def judge_folders(reference: Path, candidate: Path, floor: Path | None, margins: dict | None) -> dict:
    import soundfile as sf

    from anetts.listen import gate as G
    from anetts.listen.metrics import compare, features
    from anetts.listen.toolkit import Listener

    ref, cand = _folder(reference), _folder(candidate)
    low = _folder(floor) if floor is not None else {}
    missing = sorted((set(ref) ^ set(cand)) | (set(ref) - set(low) if floor is not None else set()))
    if missing:
        raise ValueError(f"the folders do not hold the same <language>/<name>.wav files: {missing[:5]}")
    listener = Listener()

    def heard(path: Path, language: str):
        audio, rate = sf.read(path, dtype="float32", always_2d=True)
        return features(listener, audio.mean(axis=1), rate, language)

    clips: dict[str, list[dict]] = {}
    for name in ref:
        language = name.split("/", 1)[0]
        item = {"sentence": {"file": name}, "reference": heard(ref[name], language),
                "candidate": heard(cand[name], language)}
        if floor is not None:
            item["floor"] = heard(low[name], language)
        clips.setdefault(language, []).append(item)
    if floor is None:
        return {"passed": None, "languages": {
            lang: {"summary": G.summarize([compare(i["reference"], i["candidate"], lang) for i in items]),
                   "rows": [{"sentence": i["sentence"], **compare(i["reference"], i["candidate"], lang)} for i in items]}
            for lang, items in clips.items()}}
    return G.judge(clips, G.Margins.from_config(margins))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="anetts listen", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", type=Path, help="a built model to render and judge")
    ap.add_argument("--backend", default=None, help="for --model-dir: the executor (default: the one that runs the "
                                                    "compiled packages: mil on Linux, coreml on macOS)")
    ap.add_argument("--limit", type=int, default=None, help="sentences per corpus set (default: the config's, or all)")
    ap.add_argument("--reference", type=Path, help="folder of upstream's clips at one seed")
    ap.add_argument("--floor", type=Path, help="folder of upstream's clips at another seed")
    ap.add_argument("--candidate", type=Path, help="folder of the candidate's clips")
    ap.add_argument("--config", type=Path, default=Path("config.yaml"), help="where the `listen` block is")
    ap.add_argument("--model", default=None, help="the config's model entry (default: the manifest's model)")
    ap.add_argument("--clips", type=Path, default=None, help="for --model-dir: keep the worst clips here")
    ap.add_argument("-o", "--output", type=Path, default=None, help="the JSON report (default: stdout)")
    args = ap.parse_args(argv)
    from anetts.listen.toolkit import ToolkitError
    from anetts.runtime.errors import TTSError

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    folders = [args.reference, args.candidate]
    try:
        if (args.model_dir is None) == all(f is None for f in folders):
            raise ValueError("give --model-dir, or --reference and --candidate (with --floor for a verdict)")
        if args.model_dir is not None:
            from anetts.listen.build import judge_runtime
            from anetts.loader import load
            from anetts.runtime.runners import default_executor

            tts = load(args.model_dir, backend=args.backend or default_executor(has_torchscript=False))
            settings = dict(_settings(args.config, args.model or tts.artifacts.manifest["model"]))
            if args.limit is not None:
                settings["limit"] = args.limit
            with tempfile.TemporaryDirectory() as tmp:
                weights = tts.artifacts.model_dir / tts.artifacts.manifest.get("weights_dir", "weights")
                report = judge_runtime(tts, weights, settings, args.clips or Path(tmp))
        else:
            if None in folders:
                raise ValueError("--reference and --candidate go together")
            margins = None
            if args.floor is not None:
                if args.model is None:
                    raise ValueError("--floor needs --model: the config entry whose listen.margins to hold to")
                margins = _settings(args.config, args.model)["margins"]
            report = judge_folders(args.reference, args.candidate, args.floor, margins)
    except (ValueError, OSError) as e:
        print(f"anetts listen: error: {e}", file=sys.stderr)
        return 2
    except (ToolkitError, TTSError) as e:
        print(f"anetts listen: error: {e}", file=sys.stderr)
        return 1
    text = json.dumps(report, indent=1, default=_plain)
    if args.output:
        args.output.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    if report.get("passed") is False:
        print(f"anetts listen: the gate failed on {', '.join(report['failed'])}", file=sys.stderr)
        return 1
    return 0


def _plain(value):
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")


if __name__ == "__main__":
    sys.exit(main())
