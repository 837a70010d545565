"""The HTML report of the session's kokoro-tiny build: built by `snakemake all`, showing the figures
actually in its inputs, picking up a bench JSON dropped into bench/, failing clearly on bad input."""
from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import wave
from io import BytesIO
from pathlib import Path

import pytest

from htmlscan import data_uri_bytes, scan
from workflow_helpers import run_snakemake

MODEL = "kokoro-tiny"


def _fmt(v: float) -> float:
    return float(f"{v:.4g}")  # what the SVG's data-value holds


@pytest.fixture(scope="module")
def model_dir(built_workflow) -> Path:
    return Path(built_workflow) / "artifacts" / MODEL


@pytest.fixture(scope="module")
def page(model_dir):
    return scan((model_dir / "report.html").read_text(encoding="utf-8"))


def _jsons(model_dir: Path, pattern: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(model_dir.glob(pattern))]


def test_all_builds_a_self_contained_report(model_dir, page):
    assert (model_dir / "report.html").is_file()
    assert "script" not in page.elements and "link" not in page.elements and "iframe" not in page.elements
    external = [u for u in page.urls if not (u.startswith("data:") or u.startswith("#"))]
    assert not external, f"the report refers outside itself: {external[:5]}"


def test_parity_figure_holds_every_bucket_and_the_gate(model_dir, page):
    reports = _jsons(model_dir, "parity/*/*.json")
    assert len(reports) == 4
    bars = page.figures["parity-snr"]["bars"]
    assert set(bars) == {f"{r['stage']}/{r['bucket']}" for r in reports}
    for r in reports:
        assert bars[f"{r['stage']}/{r['bucket']}"] == _fmt(r["backends"]["mil"]["min_snr_db"])
    gate = reports[0]["gate"]
    assert page.figures["parity-snr"]["lines"] == {"gate": _fmt(gate["min_snr_db"]), "target": _fmt(gate["target_snr_db"])}
    bundle_bars = page.figures["bundle-parity-snr"]["bars"]
    for b in _jsons(model_dir, "bundles/*.parity.json"):
        for bucket, f in b["functions"].items():
            assert bundle_bars[f"{b['stage']}:{f['function']}"] == _fmt(f["min_snr_db"])


def test_packages_show_their_ops_lint_and_bundle_ratios(model_dir, page):
    for path in sorted(model_dir.glob("inspect/*/*.json")):
        info = json.loads(path.read_text())
        label = f"{path.parent.name}/{path.stem}"
        assert page.tags["lint"][label]["data-count"] == str(len(info["lint"]))
        for fname, fn in info["functions"].items():
            bars = page.figures[f"ops:{label}:{fname}"]["bars"]
            assert {k.rsplit(":", 1)[1]: int(v) for k, v in bars.items()} == fn["ops"]
    for path in sorted(model_dir.glob("bundles/*.json")):
        if path.name.endswith(".parity.json"):
            continue
        ratio = json.loads(path.read_text())["ratio"]
        assert page.text[("ratio", path.stem)] == f"{ratio:.3f}"


def test_ane_share_is_in_the_manifest_and_the_report(model_dir, page):
    """Per stage MACs per audio second from the convert reports' MACs, at the largest bucket; eligible
    only in CPU_AND_NE, fp16, lint-clean packages; the runtime's loader reads the manifest as before."""
    from anetts.compile.ane_share import why_not_eligible
    from anetts.models.kokoro.share import audio_seconds
    from anetts.runtime.manifest import ModelArtifacts

    manifest = json.loads((model_dir / "manifest.json").read_text())
    share = manifest["ane_share"]
    reports = {(r["stage"], r["bucket"]): r for r in _jsons(model_dir, "packages/*/*.json")}
    assert {s["stage"] for s in share["stages"]} == {s for s, _ in reports}
    for s in share["stages"]:
        mine = {b: r for (st, b), r in reports.items() if st == s["stage"]}
        seconds = {b: audio_seconds(s["stage"], r["geometry"]) for b, r in mine.items()}
        assert s["bucket"] == max(seconds, key=seconds.get)
        r = mine[s["bucket"]]
        assert s["macs"] == r["macs"]["main"]["total"] > 0
        assert s["macs_per_second"] == pytest.approx(s["macs"] / seconds[s["bucket"]])
        units = manifest["stages"][s["stage"]]["compute_units"]
        assert s["eligible"] == all(not why_not_eligible(units, x["precision"], x["lint"]) for x in mine.values())
        assert page.text[("share-stage", s["stage"])] == s["stage"]
    eligible = sum(s["macs_per_second"] for s in share["stages"] if s["eligible"])
    assert share["share"] == pytest.approx(eligible / sum(s["macs_per_second"] for s in share["stages"]))
    assert page.text[("ane-share", f"{share['share']:.6f}")] == f"{100 * share['share']:.1f} %"
    for p in manifest["packages"]:
        assert p["macs"] == {"main": reports[(p["stage"], p["bucket"])]["macs"]["main"]["total"]}
    ModelArtifacts.load(model_dir)  # a key the loader does not know is left alone


def test_generator_plot_and_audio_are_the_builds_own(model_dir, page):
    plot = [i for i in page.images if i.get("data-figure") == "waveform-diff"]
    assert len(plot) == 1
    assert data_uri_bytes(plot[0]["src"], "image/png") == (model_dir / "parity_waveform.png").read_bytes()
    parity = json.loads((model_dir / "parity/generator/3s.json").read_text())
    lo, hi = parity["valid_regions"]["waveform"]
    clips = {a["data-audio"]: a for a in page.audio}
    assert set(clips) == {"3s/reference", "3s/mil"}
    for a in clips.values():
        with wave.open(BytesIO(data_uri_bytes(a["src"], "audio/wav"))) as w:
            assert (w.getframerate(), w.getnchannels(), w.getnframes()) == (24000, 1, hi - lo)


def test_build_benchmark_lists_every_job(model_dir, page):
    # every job's benchmark but the report's own (a rule cannot read a file it writes after it ran)
    tsvs = sorted(p for p in model_dir.glob("benchmarks/**/*.tsv") if p.name != "report.tsv")
    assert len(tsvs) >= 1 + 1 + 3 * 4 + 2 * 4  # weights, reference, export/convert/parity per package, bundles
    jobs = page.tags["job"]
    assert set(jobs) == {p.relative_to(model_dir / "benchmarks").with_suffix("").as_posix() for p in tsvs}
    wall = {}
    for p in tsvs:
        with open(p) as f:
            wall.setdefault(p.relative_to(model_dir / "benchmarks").parts[0].removesuffix(".tsv"), []).append(
                float(list(csv.DictReader(f, delimiter="\t"))[-1]["s"]))
    bars = page.figures["build-wall"]["bars"]
    # 4 significant digits of a float sum: at a ...5 boundary the order of the additions picks the side
    assert bars == pytest.approx({rule: sum(v) for rule, v in wall.items()}, rel=5.01e-4, abs=0)


def test_provenance_names_the_commit_of_the_build(built_workflow, model_dir, page):
    prov = json.loads((model_dir / "manifest.json").read_text())["provenance"]
    commit = subprocess.run(["git", "-C", str(built_workflow), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()  # the fixture commits its workflow copy
    assert prov["git"]["commit"] == commit
    texts = [t for (k, _), t in page.text.items() if k == "provenance"]
    assert any(commit in t and f"torch {prov['versions']['torch']}" in t and prov["machine"]["machine"] in t
               for t in texts), texts


def test_declared_inputs_are_what_the_directory_holds(built_workflow, model_dir, monkeypatch):
    """The rule's inputs (from the config) and `anetts report`'s (from the directory) agree."""
    import yaml

    from anetts.report.inputs import discover_inputs, report_inputs
    from anetts.workflow import WorkflowConfig

    monkeypatch.chdir(built_workflow)
    wf = WorkflowConfig(yaml.safe_load(Path("config.yaml").read_text()), root=built_workflow)
    declared = report_inputs(wf, MODEL, {"weights": ("artifacts/{model}/benchmarks/weights.tsv", None)})
    found = discover_inputs(Path("artifacts") / MODEL)
    assert declared["job_benchmarks"] == ["artifacts/kokoro-tiny/benchmarks/weights.tsv"]
    for key in declared:
        if key != "job_benchmarks":
            assert sorted(map(str, declared[key])) == sorted(map(str, found[key])), key
            assert all(Path(p).is_file() for p in declared[key]), key


# ------------------------------------------------------------------ a bench JSON dropped in

@pytest.fixture(scope="module")
def with_bench(built_workflow, module_tmp) -> Path:
    """A copy of the build, benchmarked with the torch backend, then `snakemake all` again."""
    work = module_tmp / "wf"
    shutil.copytree(built_workflow, work, symlinks=True)
    mdir = work / "artifacts" / MODEL
    done = subprocess.run([sys.executable, "-m", "anetts.cli", "bench", "--model-dir", str(mdir), "--backend", "torch",
                           "--iterations", "1", "--warmup", "0", "--upstream", "--threads", "1"],
                          cwd=work, capture_output=True, text=True, env={**_env(work)})
    assert done.returncode == 0, done.stderr[-3000:]
    proc = run_snakemake(work, "all")
    return work, proc


def _env(work: Path) -> dict:
    import os

    return dict(os.environ, PYTHONPATH=str(work))


def test_a_new_bench_json_reruns_only_the_report_and_shows_up(with_bench):
    work, proc = with_bench
    mdir = work / "artifacts" / MODEL
    benches = sorted((mdir / "bench").glob("*.json"))
    assert len(benches) == 1 and benches[0].name.count("-torch-") == 1 and benches[0].name.endswith("Z.json")
    log = proc.stdout + proc.stderr
    assert "rule report:" in log or "localrule report:" in log
    for other in ("export", "convert", "parity", "bundle", "manifest"):
        assert f"rule {other}:" not in log, f"{other} reran after adding a bench JSON"
    b = json.loads(benches[0].read_text())
    page = scan((mdir / "report.html").read_text(encoding="utf-8"))
    assert benches[0].name in page.tags["bench"]
    for r in b["end_to_end"]:
        assert page.text[("rtf", f"{benches[0].name}:{r['target_s']}")] == f"{r['rtf_median']:.4f}"


# ------------------------------------------------------------------ bad input

@pytest.fixture()
def tree(model_dir, tmp_path) -> Path:
    dest = tmp_path / "artifacts" / MODEL
    shutil.copytree(model_dir, dest, ignore=shutil.ignore_patterns("export", "reference", "weights", "logs", "*.mlpackage"))
    return dest


def _report_cli(mdir: Path):
    return subprocess.run([sys.executable, "-m", "anetts.cli", "report", "--model-dir", str(mdir)],
                          capture_output=True, text=True)


@pytest.mark.parametrize("victim, damage, says", [
    ("inspect/generator/3s.json", "delete", "is missing"),
    ("parity/duration/t32.json", "{not json", "is not valid JSON"),
    ("bundles/f0ntrain.json", '{"ratio": 1.0}', "lacks key"),
    ("parity_waveform.png", "not a png", "is not a PNG"),
    ("benchmarks/weights.tsv", "s\tx\n1\t2\n", "is not a benchmark TSV"),
    ("bench/mac-coreml.json", '{"kind": "anetts-bench", "schema": 1}', "missing key"),
])
def test_a_bad_input_fails_naming_it_and_leaves_no_report(tree, victim, damage, says):
    target = tree / victim
    assert (tree / "report.html").is_file()  # the copied good report: a failure must remove it
    if damage == "delete":
        target.unlink()
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(damage)
    done = _report_cli(tree)
    assert done.returncode == 1
    assert str(target) in done.stderr and says in done.stderr, done.stderr
    assert not (tree / "report.html").exists()


def test_report_cli_rebuilds_the_same_figures(tree):
    (tree / "report.html").unlink()
    done = _report_cli(tree)
    assert done.returncode == 0, done.stderr
    page = scan((tree / "report.html").read_text(encoding="utf-8"))
    reports = _jsons(tree, "parity/*/*.json")
    assert {k: v for k, v in page.figures["parity-snr"]["bars"].items()} == {
        f"{r['stage']}/{r['bucket']}": _fmt(r["backends"]["mil"]["min_snr_db"]) for r in reports}
