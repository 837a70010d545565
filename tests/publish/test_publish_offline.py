"""`anetts publish --dry-run` without a token or network (issue 21, item 6).

It said "no Hugging Face token" without one, and ended in a bare `OfflineModeIsEnabled` traceback
offline with one. A dry run stages the tree and the model card and prints them, saying it could not
compare them with the remote; a real publish still refuses, sending nothing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from anetts.publish import PublishError

REPO = Path(__file__).resolve().parents[2]


def publish_offline(model_dir: Path, home: Path, *extra: str, **extra_env) -> subprocess.CompletedProcess:
    """`anetts publish` with HF_HUB_OFFLINE=1, an empty HF_HOME (no saved token) and no HF_TOKEN unless given."""
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HOME=str(home), HF_HUB_OFFLINE="1",
               HF_ENDPOINT="http://127.0.0.1:9")  # a closed port: nothing could leave even if tried
    env.pop("HF_TOKEN", None)
    env.update(extra_env)
    return subprocess.run([sys.executable, "-m", "anetts.cli", "publish", "--model-dir", str(model_dir),
                           "--repo-id", "anetts/offline", *extra], capture_output=True, text=True, env=env, timeout=300)


def test_dry_run_offline_without_token_stages_and_prints_the_tree_and_card(model_copy, tmp_path):
    proc = publish_offline(model_copy, tmp_path / "hf", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "could not compare with the remote anetts/offline@main: no Hugging Face token" in out
    tree = model_copy / "publish" / "tree"
    for rel in ("README.md", "LICENSE", "manifest.json", "kokoro-tiny/manifest.json"):
        assert f"  {rel} ({(tree / rel).stat().st_size} bytes)" in out
    assert "dry run: nothing was sent" in out and "---- README.md (model card) ----" in out
    assert (tree / "README.md").read_text() in out and "Traceback" not in proc.stderr
    assert not (model_copy / "publish" / "published.json").exists()


def test_dry_run_offline_with_a_token_says_offline_and_publishing_refuses(model_copy, tmp_path):
    proc = publish_offline(model_copy, tmp_path / "hf", "--dry-run", HF_TOKEN="hf_test_token")
    assert proc.returncode == 0, proc.stderr
    assert "could not compare with the remote anetts/offline@main: Hugging Face offline mode is on" in proc.stdout
    assert "Traceback" not in proc.stderr and "dry run: nothing was sent" in proc.stdout
    proc = publish_offline(model_copy, tmp_path / "hf", HF_TOKEN="hf_test_token")
    assert proc.returncode == 1 and "offline mode is on (HF_HUB_OFFLINE)" in proc.stderr and "Traceback" not in proc.stderr
    assert not (model_copy / "publish" / "published.json").exists()


def test_the_model_card_says_which_weights_each_source_gave(built_model):
    """Real weights from the ONNX export or a local copy were carded as "synthetic ... speaks noise"."""
    from anetts.publish.layout import model_card, runtime_files

    manifest = json.loads((built_model / "manifest.json").read_text())
    summary = json.loads((built_model / "parity_summary.json").read_text())
    variants = runtime_files(built_model, manifest)
    files = {f"{manifest['model']}/{f}": 1 for fs in variants.values() for f in fs}

    def card(**weights) -> str:
        return model_card({**manifest, "weights": weights}, summary, files, "o/n", variants)

    synthetic = card(source="synthetic", preset="kokoro-tiny", seed=0)
    assert "Weights: **synthetic** (`kokoro-tiny`, seed 0)" in synthetic and "base_model:" not in synthetic
    onnx = card(source="onnx", model=".cache/kokoro-onnx/kokoro-v1.0.int8.onnx", sha256="ab" * 32)
    assert f"ONNX export `kokoro-v1.0.int8.onnx` (sha256 `{'ab' * 32}`)" in onnx
    hf = card(source="hf", repo_id="hexgrad/Kokoro-82M", revision="f" * 40)
    assert f"Weights: `hexgrad/Kokoro-82M` at revision `{'f' * 40}`" in hf
    local = card(source="local", path="/somewhere")
    for real in (onnx, hf, local):
        assert "base_model: hexgrad/Kokoro-82M\n" in real and "**synthetic**" not in real
    with pytest.raises(PublishError, match="unknown weights source 'ftp'"):
        card(source="ftp")


def test_a_family_without_hub_licence_data_is_not_published():
    """The licence a Hub repo carries is the family's declaration (FamilyDecl.hub); Fish declares none."""
    from anetts.publish.layout import hub_card

    assert hub_card("kokoro", "kokoro-tiny").license == "apache-2.0"
    with pytest.raises(PublishError, match=r"fish-tiny: the fish family declares no licence data for the Hub"):
        hub_card("fish", "fish-tiny")
    with pytest.raises(PublishError, match=r"x: unknown family 'nope'"):
        hub_card("nope", "x")
