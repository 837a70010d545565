"""Rule end_to_end: the Kokoro runtime over the compiled packages against upstream KModel, with
upstream's source draws replayed; its verdict in the manifest, a failed gate leaving no manifest."""
from __future__ import annotations

import json
import shutil

import pytest
import yaml

from anetts.models.kokoro.end_to_end import gate_rows
from workflow_helpers import run_snakemake

MODEL = "kokoro-tiny"


def row(snr=10.0, corr=0.95, floor=0.9, durations=True):
    return {"waveform_snr_db": snr, "log_mel_corr": corr, "durations_equal": durations,
            "seed_floor": {"log_mel_corr": floor}}


def test_gate_checks_each_key_on_the_worst_text():
    rows = [row(), row(snr=4.0, corr=0.8996, floor=0.9)]
    assert gate_rows(rows, {"max_log_mel_corr_gap": 0.0005}) == {"durations_equal": True, "log_mel_corr": True}
    assert gate_rows(rows, {"max_log_mel_corr_gap": 0.0003})["log_mel_corr"] is False
    assert gate_rows(rows, {"min_waveform_snr_db": 5})["waveform_snr_db"] is False
    assert gate_rows([row(durations=False)], {})["durations_equal"] is False
    assert "durations_equal" not in gate_rows([row(durations=False)], {"durations_equal": False})
    with pytest.raises(ValueError, match=r"unknown keys \['min_snr'\]"):
        gate_rows(rows, {"min_snr": 3})


def test_build_gates_the_compiled_chain_end_to_end(built_workflow):
    mdir = built_workflow / "artifacts" / MODEL
    report = json.loads((mdir / "end_to_end.json").read_text())
    assert report["passed"] and report["backend"] == "mil"  # the packages, not the fp32 exports
    cfg = yaml.safe_load((built_workflow / "config.yaml").read_text())["families"]["kokoro"]["end_to_end"]
    assert [r["phonemes"] for r in report["texts"]] == cfg["texts"]
    for r in report["texts"]:
        assert r["durations_equal"] and r["frames"] > 0 and set(r["buckets"]) == {"duration", "f0ntrain", "decoder_pre", "generator"}
        # closer to upstream than upstream is to itself with another draw: the draws were replayed
        assert r["log_mel_corr"] > r["seed_floor"]["log_mel_corr"] and r["waveform_snr_db"] > r["seed_floor"]["waveform_snr_db"]
        assert r["f0_max_abs_hz"] < 5.0
    manifest = json.loads((mdir / "manifest.json").read_text())
    assert manifest["end_to_end"] == [{"bucket": "end_to_end", "passed": True, "checks": report["checks"],
                                       "report": "end_to_end.json"}]


def test_a_failed_end_to_end_gate_leaves_no_manifest(built_workflow, tmp_path):
    work = tmp_path / "wf"
    shutil.copytree(built_workflow, work, symlinks=True)  # keeps mtimes: only the changed gate reruns
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["models"][MODEL]["end_to_end"] = {"gate": {"min_waveform_snr_db": 100}}
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    proc = run_snakemake(work, "all", check=False)
    mdir = work / "artifacts" / MODEL
    assert proc.returncode != 0 and "end-to-end check failed ['waveform_snr_db']" in proc.stdout + proc.stderr
    failed = json.loads((mdir / "end_to_end.failed.json").read_text())
    assert failed["passed"] is False and failed["gate"]["min_waveform_snr_db"] == 100
    assert failed["gate"]["max_log_mel_corr_gap"] == 0.0005  # the family's gate, the model's key over it
    assert not (mdir / "end_to_end.json").exists() and not (mdir / "manifest.json").exists()


def test_end_to_end_can_be_turned_off_and_fish_has_one():
    import copy

    from anetts.workflow import WorkflowConfig, validate_config
    from workflow_helpers import REPO

    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    assert WorkflowConfig(cfg).end_to_end_reports(MODEL) == ["artifacts/kokoro-tiny/end_to_end.json"]
    assert WorkflowConfig(cfg).end_to_end_reports("fish-tiny") == ["artifacts/fish-tiny/end_to_end.json"]
    # the families' keys stay their own (no schema defaults of one family's keys in the other's block)
    assert "seed" not in WorkflowConfig(validate_config(copy.deepcopy(cfg))).end_to_end_params("fish-tiny")
    cfg["models"][MODEL]["end_to_end"] = {"enabled": False}
    assert WorkflowConfig(cfg).end_to_end_reports(MODEL) == []
