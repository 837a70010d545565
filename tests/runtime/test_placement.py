"""Placement measured on a Mac (`anetts bench --placement`, anetts.runtime.placement) as far as Linux
goes: the flag refused here naming macOS; a bench JSON in the documented schema read by the runtime
(the newest for this chip, others and broken ones left out), shown by the report and the model card."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from anetts.runtime.placement import PlacementError, check_placement, chip_name, measured_placement
from rt_common import copy_model_dir


def placement(chosen: dict[str, str]) -> dict:
    """A placement record as `measure_placement` writes it, for the stages in `chosen`."""
    return {"schema": 1, "iterations": 3, "stages": {
        s: {"bucket": "3s", "chosen": c, "units": {
            "CPU_AND_NE": {"median_s": 0.010 if c == "CPU_AND_NE" else 0.030,
                           "plan": {"compute_units": "CPU_AND_NE", "by_device": {"ane": 40, "cpu": 2},
                                    "cost_by_device": {"ane": 0.9, "cpu": 0.1}, "ane_op_fraction": 0.95}},
            "CPU_AND_GPU": {"median_s": 0.020, "plan": None}}} for s, c in chosen.items()}}


def bench_json(model: str, chip: str, created: str, chosen: dict[str, str]) -> dict:
    """The smallest bench JSON `validate_bench` takes, with a placement (as sent back from a Mac)."""
    return {"kind": "anetts-bench", "schema": 1, "model": model, "family": "kokoro", "backend": "coreml",
            "chip": chip, "created_utc": created, "settings": {"iterations": 3, "warmup": 1, "seed": 0},
            "stages": [], "end_to_end": [], "memory": {"peak_rss_bytes": 1 << 30},
            "provenance": {"machine": {"system": "Darwin", "release": "24.1.0", "machine": "arm64"}},
            "compute_plan": {"available": False, "reason": "not requested"}, "placement": placement(chosen)}


def put(mdir: Path, name: str, data) -> Path:
    path = mdir / "bench" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize("change, says", [
    (lambda p: p["stages"]["generator"].update(chosen="CPU_ONLY"), "chosen ('CPU_ONLY') must be one of"),
    (lambda p: p["stages"]["generator"]["units"].update(NPU={"median_s": 1.0}), "'NPU' is not one of"),
    (lambda p: p["stages"]["generator"]["units"]["CPU_AND_GPU"].update(median_s=0), "median_s must be a positive"),
    (lambda p: p.update(schema=2), "schema must be 1"),
])
def test_a_placement_that_breaks_the_schema_is_named(change, says):
    p = placement({"generator": "CPU_AND_NE"})
    check_placement(p, "x.json")
    change(p)
    with pytest.raises(PlacementError, match=re.escape(says)) as e:
        check_placement(p, "x.json")
    assert "x.json" in str(e.value)


def test_the_runtime_takes_the_newest_placement_of_this_chip(model_dir, tmp_path, caplog):
    from anetts.loader import placed_units
    from anetts.runtime.manifest import ModelArtifacts

    mdir = copy_model_dir(model_dir, tmp_path / "kokoro-tiny")
    arts = ModelArtifacts.load(mdir)
    assert measured_placement(mdir) is None and placed_units(arts, "coreml") is None
    here = chip_name()
    put(mdir, "a-old.json", bench_json("kokoro-tiny", here, "2026-12-01T10:00:00Z", {"generator": "CPU_AND_GPU"}))
    put(mdir, "b-new.json", bench_json("kokoro-tiny", here, "2026-12-02T10:00:00Z",
                                       {"generator": "CPU_AND_NE", "decoder_pre": "CPU_AND_NE"}))
    put(mdir, "c-other.json", bench_json("kokoro-tiny", "Apple M9", "2026-12-03T10:00:00Z", {"generator": "CPU_AND_GPU"}))
    broken = put(mdir, "d-broken.json", '{"kind": "anetts-bench", "chip": "x", "placement": {"schema": 1}}')
    got = measured_placement(mdir)
    assert got["units"] == {"generator": "CPU_AND_NE", "decoder_pre": "CPU_AND_NE"} and got["file"].endswith("b-new.json")
    assert str(broken) in caplog.text  # named, and the others still read
    assert measured_placement(mdir, chip="Apple M9")["units"] == {"generator": "CPU_AND_GPU"}
    assert placed_units(arts, "coreml") == got["units"]
    assert placed_units(arts, "torch") is None and placed_units(arts, "mil") is None  # only Core ML has units


def test_bench_placement_is_refused_off_macos_naming_it(model_dir):
    if sys.platform == "darwin":
        pytest.skip("on macOS --placement runs")
    done = subprocess.run([sys.executable, "-m", "anetts.cli", "bench", "--model-dir", str(model_dir), "--placement",
                           "--backend", "coreml"], capture_output=True, text=True)
    assert done.returncode == 1 and "--placement" in done.stderr and "macOS" in done.stderr, done.stderr
    assert not (model_dir / "bench").exists()


def test_the_report_and_the_model_card_show_a_placement(model_dir, tmp_path):
    from anetts.publish.layout import placement_lines
    from anetts.runtime.placement import placement_records

    mdir = tmp_path / "artifacts" / "kokoro-tiny"
    shutil.copytree(model_dir, mdir, ignore=shutil.ignore_patterns("export", "reference", "weights", "logs", "*.mlpackage"))
    put(mdir, "apple-m2-coreml-20261202T100000Z.json",
        bench_json("kokoro-tiny", "Apple M2", "2026-12-02T10:00:00Z", {"generator": "CPU_AND_NE", "duration": "CPU_AND_GPU"}))
    done = subprocess.run([sys.executable, "-m", "anetts.cli", "report", "--model-dir", str(mdir)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    html = (mdir / "report.html").read_text(encoding="utf-8")
    assert "<b data-placement='generator'>CPU_AND_NE</b>" in html and "<b data-placement='duration'>CPU_AND_GPU</b>" in html
    card = "\n".join(placement_lines(placement_records(mdir)))
    assert "## Placement measured on a Mac" in card
    assert "| Apple M2 | 2026-12-02T10:00:00Z | generator | 3s | 0.0100 | 0.0200 | 0.95 | CPU_AND_NE |" in card
    assert placement_lines([]) == []
