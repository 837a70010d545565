"""`anetts bench` on Linux: the harness (schedule, statistics, JSON) on the mil and torch backends,
and the coreml backend refused with the platform named."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from anetts.bench import (BenchError, parse_compute_units, run_bench, schedule, stats, usable_targets,
                          validate_bench)


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "anetts.cli", "bench", *args], capture_output=True, text=True, cwd=cwd)


def test_stats_are_the_usual_order_statistics():
    s = stats([0.4, 0.1, 0.3, 0.2])
    assert (s["n"], s["median_s"], s["min_s"]) == (4, pytest.approx(0.25), 0.1)
    assert s["p90_s"] == pytest.approx(0.37) and s["p95_s"] == pytest.approx(0.385)
    assert s["samples_s"] == [0.4, 0.1, 0.3, 0.2]
    with pytest.raises(BenchError, match="no timed samples"):
        stats([])


def test_schedule_is_seeded_and_counterbalanced():
    cases = [f"c{i}" for i in range(6)]
    a, b = schedule(cases, 5, seed=3), schedule(cases, 5, seed=3)
    assert a == b and a != schedule(cases, 5, seed=4)
    assert all(sorted(r) == cases for r in a)
    assert len({tuple(r) for r in a}) > 1 and len({r[0] for r in a}) > 1  # not one fixed order, not one first case


def test_targets_fit_the_largest_bucket():
    assert usable_targets((3, 7, 15, 30), 3.0) == [3]  # capacity in seconds (Kokoro: 120 frames at 40 Hz)
    assert usable_targets((3, 7, 15, 30), 30.0) == [3, 7, 15, 30]
    assert usable_targets((7,), 3.0) == [3]
    assert usable_targets((3, 7), 6.3) == [3]  # Fish: the frames a prompt leaves in the context


def test_compute_units_argument():
    assert parse_compute_units(None) is None
    assert parse_compute_units(["CPU_AND_NE"]) == "CPU_AND_NE"
    assert parse_compute_units(["generator=CPU_AND_GPU", "duration=ALL"]) == {"generator": "CPU_AND_GPU", "duration": "ALL"}
    with pytest.raises(BenchError, match="NPU"):
        parse_compute_units(["NPU"])
    with pytest.raises(BenchError, match="STAGE=UNITS"):
        parse_compute_units(["generator=GPU", "ALL"])


def test_mil_backend_bench_result(model_dir):
    r = run_bench(model_dir, "mil", iterations=1, warmup=0, targets=(3,), upstream=(), seed=1)
    validate_bench(json.loads(json.dumps(r)), "mil result")
    assert r["backend"] == "mil" and r["model"] == "kokoro-tiny"
    assert {(s["stage"], s["bucket"]) for s in r["stages"]} == {("duration", "t32"), ("f0ntrain", "3s"),
                                                                ("decoder_pre", "3s"), ("generator", "3s")}
    for s in r["stages"]:
        w = s["warm"]
        assert w["n"] == 1 and 0 < w["min_s"] <= w["median_s"] <= w["p95_s"] and s["load_s"] > 0 and s["first_call_s"] > 0
    (e2e,) = r["end_to_end"]
    assert e2e["target_s"] == 3 and 0 < e2e["audio_s"] <= 3 and e2e["buckets"]["generator"] == "3s"
    assert e2e["rtf_median"] == pytest.approx(e2e["warm"]["median_s"] / e2e["audio_s"])
    assert set(e2e["stages_median_s"]) >= {"duration", "f0ntrain", "decoder_pre", "generator", "har"}
    rounds = r["settings"]["schedule"]
    expected = ["e2e:3", *(f"stage:{s}/{b}" for s, b in (("duration", "t32"), ("f0ntrain", "3s"),
                                                           ("decoder_pre", "3s"), ("generator", "3s")))]
    assert len(rounds) == 1 and sorted(rounds[0]) == sorted(expected)
    assert r["compute_plan"]["available"] is False and "coreml" in r["compute_plan"]["reason"]
    assert r["memory"]["peak_rss_bytes"] >= r["memory"]["peak_rss_bytes_after_load"] > 0
    assert r["provenance"]["machine"]["system"] == "Linux"


def test_torch_cli_writes_a_valid_json_with_upstream_side_by_side(model_dir, tmp_path):
    out = tmp_path / "b.json"
    done = _cli("--model-dir", str(model_dir), "--backend", "torch", "--iterations", "2", "--warmup", "0",
                "--threads", "1", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert str(out) in done.stdout and "RTF" in done.stdout
    r = validate_bench(json.loads(out.read_text()), str(out))
    (e2e,) = r["end_to_end"]
    cpu = e2e["upstream"]["cpu"]
    assert cpu["ratio_upstream_over_runtime"] == pytest.approx(cpu["warm"]["median_s"] / e2e["warm"]["median_s"])
    assert r["upstream"]["mps"]["available"] is False and "MPS" in r["upstream"]["mps"]["reason"]
    assert r["settings"]["torch_threads"] == 1
    assert len(r["settings"]["schedule"][0]) == 4 + 1 + 1  # packages, runtime end to end, upstream cpu


def test_coreml_is_refused_off_macos_naming_the_platform(model_dir):
    before = sorted(model_dir.glob("bench/*"))
    done = _cli("--model-dir", str(model_dir), "--backend", "coreml")
    assert done.returncode == 1
    assert "needs macOS" in done.stderr and f"{sys.platform!r}" in done.stderr, done.stderr
    assert sorted(model_dir.glob("bench/*")) == before


@pytest.mark.parametrize("args, says", [
    (["--iterations", "0"], "iterations >= 1"),
    (["--backend", "torch", "--compute-units", "ALL"], "coreml backend only"),
])
def test_bad_arguments_fail_clearly(model_dir, args, says):
    done = _cli("--model-dir", str(model_dir), *args)
    assert done.returncode == 1 and says in done.stderr, done.stderr


def test_missing_model_dir_is_named(tmp_path):
    done = _cli("--model-dir", str(tmp_path / "nope"), "--backend", "torch")
    assert done.returncode == 1 and str(tmp_path / "nope") in done.stderr


def test_validate_names_the_missing_key():
    with pytest.raises(BenchError, match=r"x.json: missing key 'stages'"):
        validate_bench({"kind": "anetts-bench", "schema": 1, "model": "m", "backend": "torch", "chip": "c",
                        "created_utc": "t", "settings": {}, "end_to_end": [], "memory": {}, "provenance": {}}, "x.json")
    with pytest.raises(BenchError, match="kind must be"):
        validate_bench({"kind": "other"}, "x.json")
