"""The listener gate (anetts.listen) with the real listener models on real Kokoro-82M weights (the
int8 ONNX export and kokoro-js's voices, `make onnx-weights`): upstream at another seed passes, the
same sentences in another voice fail on the speaker metrics, and the gate names them. Plus the
pieces that need no model: tokens, edit distance, margins, the verdict's arithmetic."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from anetts.listen import gate as G
from anetts.listen.build import write_listen_verdict
from anetts.listen.metrics import edits, tokens
from anetts.report.collect import read_listen
from anetts.report.render import _listen_section
from anetts.gate import ParityError

ROOT = Path(__file__).resolve().parents[1]
ONNX = ROOT / ".cache" / "kokoro-onnx"
MARGINS = {"token_error_rate": 0.02, "speaker_cosine_mean": 0.005, "speaker_cosine_min": 0.01, "distillmos_delta": 0.05,
           "dnsmos_p808_delta": 0.05, "pitch_cents": 10.0, "voicing_disagreement": 0.02, "log_mel_l1": 0.05}


def test_transcripts_compare_by_words_or_characters():
    assert tokens("Hello, World!  It's 3 o'clock.", "en") == ["hello", "world", "it", "s", "3", "o", "clock"]
    # Japanese by its reading: one sound spelt in kanji or in kana is one transcript
    assert tokens("すずき先生は、京都の大学で教えています。", "ja") == tokens("すずき先生は きょうとの大学で教えています", "ja")
    assert tokens("玉子", "ja") == list("タマゴ") and tokens("京都", "ja") != tokens("東京", "ja")
    assert edits(["a", "b", "c"], ["a", "c"]) == 1 and edits([], ["x", "y"]) == 2 and edits(list("kitten"), list("sitting")) == 3


def test_margins_name_what_is_wrong():
    with pytest.raises(G.GateConfigError, match="unknown metric"):
        G.Margins.from_config({**MARGINS, "snr": 1})
    with pytest.raises(G.GateConfigError, match="no margin for"):
        G.Margins.from_config({k: v for k, v in MARGINS.items() if k != "pitch_cents"})
    with pytest.raises(G.GateConfigError, match=">= 0"):
        G.Margins.from_config({**MARGINS, "pitch_cents": -1})


def test_each_metric_is_judged_in_its_own_direction():
    floor = {"token_error_rate": 0.01, "speaker_cosine_mean": 0.999, "speaker_cosine_min": 0.995, "distillmos_delta": 0.0,
             "dnsmos_p808_delta": 0.0, "pitch_cents": 6.0, "voicing_disagreement": 0.01, "log_mel_l1": 0.1}
    margins = G.Margins.from_config(MARGINS)
    assert all(c["passed"] for c in G.check(dict(floor), floor, margins).values())
    worse = {"token_error_rate": 0.05, "speaker_cosine_mean": 0.98, "speaker_cosine_min": 0.9, "distillmos_delta": -0.2,
             "dnsmos_p808_delta": -0.2, "pitch_cents": 30.0, "voicing_disagreement": 0.1, "log_mel_l1": 0.3}
    assert not any(c["passed"] for c in G.check(worse, floor, margins).values())
    better = {"token_error_rate": 0.0, "speaker_cosine_mean": 1.0, "speaker_cosine_min": 1.0, "distillmos_delta": 0.3,
              "dnsmos_p808_delta": 0.3, "pitch_cents": 0.0, "voicing_disagreement": 0.0, "log_mel_l1": 0.0}
    assert all(c["passed"] for c in G.check(better, floor, margins).values())


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """Upstream KModel on kokoro-82m's real weights, mapped from the ONNX export with kokoro-js's voices."""
    if not (ONNX / "kokoro-v1.0.int8.onnx").is_file() or not (ONNX / "voices-v1.0.npz").is_file():
        pytest.fail(f"real weights missing in {ONNX}: run `make onnx-weights` (`make test` does)")
    from anetts.models.kokoro.listen import Upstream
    from anetts.models.kokoro.onnx_weights import INT8_SHA256, NPM_VOICES_NAME
    from anetts.weights import materialize_weights

    out = tmp_path_factory.mktemp("onnx") / "weights"
    materialize_weights("kokoro", {"source": "onnx", "model": str(ONNX / "kokoro-v1.0.int8.onnx"), "sha256": INT8_SHA256,
                                   "voices_path": str(ONNX / NPM_VOICES_NAME),
                                   "voices": ["af_heart", "am_michael", "af_bella"]}, out)
    return Upstream(out)


def test_upstream_passes_against_itself_and_a_swapped_voice_fails_naming_the_metric(upstream, tmp_path):
    from anetts.listen.toolkit import Listener
    from anetts.models.kokoro import listen as L

    items = L.corpus({"en": ["af_heart", "am_michael"]}, limit=2)  # 6 sentences: 2 of each set
    L.render_upstream(items, upstream, (0, 1))
    listener = Listener()
    for item in items:  # another draw of upstream: inside its own floor
        item.audio["candidate"] = upstream.speak(item.sentence.text, item.voice, 2)
    L.hear(items, listener)
    same = L.verdict(items, G.Margins.from_config(MARGINS))
    lang = same["languages"]["en"]
    assert same["passed"], lang["checks"]
    assert lang["clips"] == 6 and lang["checks"]["speaker_cosine_mean"]["floor"] > 0.99
    # a passed verdict is written with its worst clips, and the report shows it with the clips side by side
    L.write_worst_clips(items, same, tmp_path / "listen")
    write_listen_verdict({**same, "backend": "upstream seed 2"}, tmp_path / "listen.json")
    html = _listen_section({"listen": [read_listen(tmp_path / "listen.json", tmp_path / "listen")]})
    assert "<h3 data-listen='en'>en: 6 clips" in html and html.count("<audio") == 2 * len(lang["worst"])
    assert "data:audio/wav;base64," in html and "upstream seed 2" in html
    _write_folders(tmp_path / "folders", items[:2])  # upstream's clips for `anetts listen` below
    for item in items:  # the build speaks every sentence in another voice of the same language
        item.audio["candidate"] = upstream.speak(item.sentence.text, "af_bella", 0)
        del item.heard["candidate"]
    L.hear(items, listener)
    swapped = L.verdict(items, G.Margins.from_config(MARGINS))
    assert not swapped["passed"] and "en: speaker_cosine_mean" in swapped["failed"], swapped["failed"]
    assert swapped["languages"]["en"]["checks"]["speaker_cosine_mean"]["candidate"] < 0.95
    L.write_worst_clips(items, swapped, tmp_path / "clips")
    worst = swapped["languages"]["en"]["worst"]["speaker_cosine_min"]
    assert (tmp_path / "clips" / worst["candidate"]).is_file()
    json.dumps(swapped, default=float)  # the report is JSON
    assert not any(math.isnan(c["candidate"]) for c in swapped["languages"]["en"]["checks"].values())
    # a failed gate leaves no verdict that looks good: the report beside it, and an error naming the metric
    with pytest.raises(ParityError, match="listener gate failed on .*en: speaker_cosine_mean"):
        write_listen_verdict({**swapped, "backend": "upstream"}, tmp_path / "swapped.json")
    assert not (tmp_path / "swapped.json").exists() and (tmp_path / "swapped.failed.json").is_file()

    # `anetts listen` over folders of wavs judges the same way: the swapped voice fails, naming the metric
    _write_folders(tmp_path / "folders", items[:2], candidate_only=True)
    folders = tmp_path / "folders"
    proc = subprocess.run([sys.executable, "-m", "anetts.cli", "listen", "--reference", str(folders / "reference"),
                           "--floor", str(folders / "floor"), "--candidate", str(folders / "candidate"),
                           "--model", "kokoro-82m-onnx", "--config", str(ROOT / "config.yaml"), "-o", str(tmp_path / "cli.json")],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "the gate failed on" in proc.stderr and "speaker_cosine" in proc.stderr
    cli = json.loads((tmp_path / "cli.json").read_text())
    assert cli["languages"]["en"]["clips"] == 2 and not cli["passed"]


def _write_folders(root: Path, items, candidate_only: bool = False) -> None:
    """<root>/<side>/<language>/<index>.wav for `anetts listen`'s folder mode."""
    import soundfile as sf

    from anetts.models.kokoro.dsp import SAMPLE_RATE

    for side in ("candidate",) if candidate_only else ("reference", "floor"):
        for item in items:
            path = root / side / item.sentence.language / f"{item.sentence.index:03d}.wav"
            path.parent.mkdir(parents=True, exist_ok=True)
            sf.write(path, item.audio[side], SAMPLE_RATE, subtype="FLOAT")


def test_anetts_listen_names_bad_arguments(tmp_path):
    def listen(*args):
        return subprocess.run([sys.executable, "-m", "anetts.cli", "listen", *args], capture_output=True, text=True, cwd=ROOT)

    proc = listen()
    assert proc.returncode == 2 and "give --model-dir, or --reference and --candidate" in proc.stderr
    (tmp_path / "a" / "en").mkdir(parents=True)
    proc = listen("--reference", str(tmp_path / "a"), "--candidate", str(tmp_path / "a"))
    assert proc.returncode == 2 and "no <language>/<name>.wav files" in proc.stderr
    proc = listen("--reference", str(tmp_path / "a"), "--candidate", str(tmp_path / "a"), "--floor", str(tmp_path / "a"))
    assert proc.returncode == 2 and "--floor needs --model" in proc.stderr


def _dry_run_jobs(tmp_path, model: str) -> dict[str, int]:
    import re

    import yaml

    from workflow_helpers import make_workflow_copy, run_snakemake

    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    cfg["model"] = model
    weights = cfg["models"]["kokoro-82m-onnx"]["weights"]
    weights["model"], weights["voices_path"] = str(ROOT / weights["model"]), str(ROOT / weights["voices_path"])
    work = make_workflow_copy(tmp_path / model, cfg)
    out = run_snakemake(work, "-n", "all").stdout
    table = out.split("Job stats:", 1)[1].split("total", 1)[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


def test_the_dag_gates_real_weights_by_listening_and_synthetic_weights_not(tmp_path):
    assert _dry_run_jobs(tmp_path, "kokoro-82m-onnx")["listen"] == 1
    assert "listen" not in _dry_run_jobs(tmp_path, "kokoro-tiny")


def test_a_missing_toolkit_is_named_not_downloaded(monkeypatch):
    import importlib.util

    from anetts.listen.toolkit import ToolkitError, require

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "faster_whisper" else real(name, *a))
    with pytest.raises(ToolkitError, match=r"faster-whisper==1\.2\.1.*make listen.*Nothing is downloaded"):
        require("faster_whisper", "librosa")
