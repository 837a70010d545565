"""The `anetts` command line: inspect and run-mil delegate to their modules; errors exit non-zero."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from anetts.cli import main


def test_inspect_command(built_workflow, tmp_path, capsys):
    pkg = built_workflow / "artifacts" / "kokoro-tiny" / "packages" / "generator" / "3s.mlpackage"
    out = tmp_path / "inspect.json"
    assert main(["inspect", str(pkg), "--json", str(out)]) == 0
    info = json.loads(out.read_text())
    assert info["functions"]["main"]["ops"]["conv_transpose"] > 0
    assert main(["inspect", str(tmp_path / "missing.mlpackage")]) != 0


def test_unknown_command_is_a_usage_error():
    assert main(["no-such-command"]) == 2


# -- faults of the command line: each a one-line error naming what is wrong, no traceback ----------

MODEL_DIR = ("artifacts", "kokoro-tiny")


def _model_dir(built_workflow):
    return built_workflow.joinpath(*MODEL_DIR)


def test_verify_help_is_accepted(capsys):
    assert main(["verify", "--help"]) == 0
    assert "--repair" in capsys.readouterr().out


@pytest.mark.parametrize("damage, named", [
    ("model.mlmodel", "not a readable Core ML model spec"),
    ("weights/weight.bin", "truncated"),
])
def test_inspect_of_a_truncated_package_says_so(built_workflow, tmp_path, capsys, damage, named):
    pkg = tmp_path / "t32.mlpackage"
    shutil.copytree(_model_dir(built_workflow) / "packages" / "duration" / "t32.mlpackage", pkg)
    victim = pkg / "Data" / "com.apple.CoreML" / damage
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 3])
    assert main(["inspect", str(pkg)]) == 1
    err = capsys.readouterr().err
    assert named in err and str(victim) in err


def test_run_mil_rejects_non_finite_inputs_naming_them(built_workflow, tmp_path, capsys):
    model_dir = _model_dir(built_workflow)
    from anetts.scenario import load_scenario

    inputs = dict(load_scenario(model_dir / "export" / "duration" / "t32.scenario.npz")[0].calls[0].inputs)
    inputs["speed"] = np.full_like(inputs["speed"], np.nan)  # ran to pred_dur=-2147483648 before
    bad = tmp_path / "nan.npz"
    np.savez(bad, **inputs)
    assert main(["run-mil", str(model_dir / "packages" / "duration" / "t32.mlpackage"), "-i", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "non-finite" in err and "speed" in err and "ref_s" not in err


def _speak(model_dir, out, *extra) -> int:
    return main(["speak", "Hello.", "-o", str(out), "--model-dir", str(model_dir), "--no-progress", *extra])


def test_speak_with_a_negative_seed_is_refused(built_workflow, tmp_path, capsys):
    out = tmp_path / "o.wav"
    assert _speak(_model_dir(built_workflow), out, "--seed", "-1") == 1
    assert "seed must be a non-negative integer, got -1" in capsys.readouterr().err
    assert not out.exists()


def test_kokoro_refuses_fish_options_naming_them(built_workflow, tmp_path, capsys):
    out = tmp_path / "o.wav"
    assert _speak(_model_dir(built_workflow), out, "--temperature", "0.5", "--reference-text", "hi") == 2
    err = capsys.readouterr().err
    assert "--reference-text, --temperature do not apply to this kokoro model" in err
    assert not out.exists()


@pytest.mark.parametrize("offset, says", [(1, "is newer than this anetts reads"),
                                           (-1, "is older than this anetts reads (4); rebuild the model")])
def test_a_manifest_of_another_version_is_refused(built_workflow, tmp_path, capsys, offset, says):
    from anetts.runtime.manifest import MANIFEST_VERSION

    model_dir = tmp_path / "model"
    shutil.copytree(_model_dir(built_workflow), model_dir, ignore=shutil.ignore_patterns("export", "reference"))
    manifest = json.loads((model_dir / "manifest.json").read_text())
    manifest["manifest_version"] = MANIFEST_VERSION + offset
    (model_dir / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "o.wav"
    assert _speak(model_dir, out) == 1
    assert f"manifest_version {MANIFEST_VERSION + offset} {says}" in capsys.readouterr().err
    assert main(["verify", str(model_dir)]) == 2
    assert says in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("output, says", [
    ("../victim", "assets[0].output: path '../victim' points outside the model directory"),
    ("packages", "which is not a folder inside the model directory holding it"),
])
def test_repair_removes_no_output_outside_the_assets_own_folder(built_workflow, tmp_path, capsys, output, says):
    """`verify --repair` removes the output a bad asset belongs to, as the manifest records it:
    an output that is not a folder holding the asset, inside the model directory, is refused."""
    model_dir = tmp_path / "model"
    shutil.copytree(_model_dir(built_workflow), model_dir, ignore=shutil.ignore_patterns("export", "reference"))
    victim = tmp_path / "victim"
    victim.mkdir()
    manifest = json.loads((model_dir / "manifest.json").read_text())
    manifest["assets"][0]["output"] = output
    (model_dir / "manifest.json").write_text(json.dumps(manifest))
    (model_dir / manifest["assets"][0]["path"]).write_bytes(b"bad")
    assert main(["verify", str(model_dir), "--repair"]) == 2
    assert says in capsys.readouterr().err
    assert victim.is_dir() and (model_dir / "packages").is_dir() and (model_dir / "manifest.json").is_file()
