"""Parity metrics and gates; the gate rejects a package whose weights were perturbed."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from anetts.compile.convert import ConvertOptions, convert_export
from anetts.compile.export import export_stage
from anetts.compile.reference import write_reference
from anetts.families import get_family
from anetts.metrics import PERFECT_DB, compare, exact_match_fraction, gap_in_noise
from anetts.gate import ParityError
from anetts.options import Gate
from anetts.scenario import load_scenario
from anetts.verify.parity import check_parity, run_parity

FAMILY = get_family("kokoro")
META = {"model": "kokoro-tiny", "family": "kokoro", "source": "synthetic", "revision": "test"}


def test_metrics_known_values():
    ref = np.array([1.0, -1.0, 1.0, -1.0])
    m = compare(ref, ref * 1.1)  # error power = 1 % of signal power → 20 dB
    assert m["snr_db"] == pytest.approx(20.0, abs=1e-6)
    assert m["psnr_db"] == pytest.approx(20.0, abs=1e-6)
    assert m["cosine"] == pytest.approx(1.0) and m["pearson"] == pytest.approx(1.0)
    assert compare(ref, ref)["snr_db"] == PERFECT_DB
    assert compare(ref, -ref)["pearson"] == pytest.approx(-1.0)
    assert not compare(ref, np.array([1.0, np.inf, 1.0, 1.0]))["finite"]
    assert exact_match_fraction(np.array([1, 2, 3, 4]), np.array([1, 2, 3, 5])) == 0.75
    with pytest.raises(ValueError, match="shape mismatch"):
        compare(ref, ref[:2])


def test_a_gap_is_measured_in_units_of_the_steps_logit_noise():
    want = np.array([2.0, 1.99, 0.0, -1.0])
    got = want + np.array([-0.02, 0.02, 0.02, -0.02])  # RMS difference 0.02: the near-tie flips
    assert gap_in_noise(0.01, want, got) == {"logit_noise": pytest.approx(0.02), "gap_in_noise": pytest.approx(0.5)}
    assert gap_in_noise(0.0, want, want) == {"logit_noise": 0.0, "gap_in_noise": 0.0}
    assert gap_in_noise(0.01, want, want)["gap_in_noise"] is None  # a flip that no noise explains


@pytest.fixture(scope="module")
def f0ntrain_packages(tiny_weights, tiny_model, tmp_path_factory):
    """f0ntrain at 3 s exported twice: from the real weights and from perturbed ones."""
    out = tmp_path_factory.mktemp("parity")
    write_reference(FAMILY, 3, tiny_weights, out / "ref.npz")
    perturbed = copy.deepcopy(tiny_model)
    with torch.no_grad():
        # F0 is ~170 Hz on average, so its SNR is dominated by the mean: scale the projection
        perturbed.predictor.F0_proj.weight.mul_(1.3)
        perturbed.predictor.N_proj.weight.mul_(1.3)
    for name, model in (("good", tiny_model), ("bad", perturbed)):
        export_stage(FAMILY, "f0ntrain", "3s", 3, None, tiny_weights, out / "ref.npz", out / f"{name}.functions",
                     out / f"{name}.scenario.npz", out / f"{name}.export.json", model=model)
        convert_export(out / f"{name}.functions", out / f"{name}.export.json", out / f"{name}.mlpackage",
                       out / f"{name}.json", ConvertOptions.make(), META)
    return out


def _parity(d, package):
    """Score a package (a name in `d`, or a path) against the good export's eager reference (what
    the DAG's parity job does)."""
    return run_parity(d / package, d / "good.scenario.npz", d / "good.export.json", Gate.make())


def test_a_bucket_is_a_scenario_of_one_call(f0ntrain_packages):
    """A one-call stage's scenario: one call of `main` on its example inputs, whose valid regions are
    the stage's `valid_regions`, and the eager wrapper's outputs expected."""
    d = f0ntrain_packages
    scenario, expected = load_scenario(d / "good.scenario.npz")
    (call,) = scenario.calls
    stage = FAMILY.stage("f0ntrain")
    assert scenario.name == "f0ntrain/3s" and call.function == "main" and list(scenario.functions) == ["main"]
    assert scenario.functions["main"] == stage.function(3)
    regions = {k: tuple(v) for k, v in stage.valid_regions(dict(call.inputs)).items() if v is not None}
    assert dict(call.valid) == regions and regions
    assert sorted(expected[0]) == sorted(t.name for t in stage.function(3).outputs)
    export = json.loads((d / "good.export.json").read_text())
    assert export["reference"] == "eager" and export["calls_per_function"] == {"main": 1}
    assert export["functions"] == [stage.function(3).to_json()] and export["geometry"] == stage.geometry(3)


def test_good_package_passes_gate(f0ntrain_packages, tmp_path):
    d = f0ntrain_packages
    report = _parity(d, "good.mlpackage")
    assert report["passed"], json.dumps(report["backends"], indent=1)[:2000]
    assert report["backends"]["torch_trace"]["min_snr_db"] > 80
    assert report["backends"]["mil"]["min_snr_db"] >= 35
    assert "skipped" in report["backends"]["coreml"]  # Linux
    assert report["torch_seconds"] > 0 and report["mil_vs_torch_time_ratio"] > 0
    check_parity(report, tmp_path / "3s.json")
    assert json.loads((tmp_path / "3s.json").read_text())["passed"]


def test_perturbed_package_is_rejected(f0ntrain_packages, tmp_path):
    d = f0ntrain_packages
    report = _parity(d, "bad.mlpackage")
    assert not report["passed"]
    assert report["backends"]["mil"]["min_snr_db"] < 35
    with pytest.raises(ParityError, match="f0ntrain/3s failed its parity gate"):
        check_parity(report, tmp_path / "3s.json")
    assert not (tmp_path / "3s.json").exists(), "a failed gate must not leave a passing-looking report"
    assert (tmp_path / "3s.failed.json").exists()


def test_a_bundle_is_held_to_its_verified_packages(f0ntrain_packages, tmp_path):
    """A bundle function that is its verified package's program again is scored by the package's
    stored outputs and not run; any other is run: one bundled from other weights fails the gate."""
    from anetts.artifacts import failed_report_path
    from anetts.compile.bundle import bundle_packages
    from anetts.verify.parity import check_bundle_parity

    d = f0ntrain_packages
    # macOS14 (iOS17 ops, as the iOS18 bundle's): its gather is the bundle's; macOS13's gains an input
    convert_export(d / "good.functions", d / "good.export.json", tmp_path / "good14.mlpackage",
                   tmp_path / "good14.json", ConvertOptions.make(deployment_target="macOS14"), META)

    def bundle_parity(verified: Path, source: Path, out: str) -> dict:
        check_parity(_parity(d, verified), tmp_path / "3s.json", tmp_path / "3s.npz")
        bundle_packages({"b3s": source}, tmp_path / f"{out}.mlpackage", default_function="b3s")
        return check_bundle_parity("f0ntrain", ["3s"], tmp_path / f"{out}.mlpackage", [verified],
                                   [d / "good.export.json"], [d / "good.scenario.npz"], [tmp_path / "3s.npz"],
                                   Gate.make(), tmp_path / f"{out}.parity.json")["functions"]["3s"]

    same = bundle_parity(tmp_path / "good14.mlpackage", tmp_path / "good14.mlpackage", "same")
    assert same["passed"] and same["same_program_as"] == str(tmp_path / "good14.mlpackage") and "ran" not in same
    assert same["min_snr_db"] == json.loads((tmp_path / "3s.json").read_text())["backends"]["mil"]["min_snr_db"]
    ran = bundle_parity(d / "good.mlpackage", d / "good.mlpackage", "ran")
    assert ran["passed"] and ran["ran"].startswith("gather op") and "same_program_as" not in ran
    with pytest.raises(ParityError, match=r"bundle f0ntrain: functions \['3s'\] failed the parity gate"):
        bundle_parity(d / "good.mlpackage", d / "bad.mlpackage", "bad")
    assert not (tmp_path / "bad.parity.json").exists()
    failed = json.loads(failed_report_path(tmp_path / "bad.parity.json").read_text())["functions"]["3s"]
    assert "ran" in failed and failed["min_snr_db"] < 35
