"""Weights: the three sources, validation errors that name the tensor, determinism."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from anetts.artifacts import tree_sha256
from anetts.models.kokoro import weights as W
from anetts.weights import WeightsSourceError, materialize_weights

HF_REPO = "hexgrad/Kokoro-82M"
REVISION = "9871713c6a29032f914cee65b617e2b6b3323770"


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_checkpoint(weights_dir: Path, edit) -> None:
    ckpt = torch.load(weights_dir / W.CHECKPOINT_NAME, weights_only=True)
    edit(ckpt)
    torch.save(ckpt, weights_dir / W.CHECKPOINT_NAME)


def test_synthetic_layout_matches_upstream_format(tiny_weights):
    ckpt = torch.load(tiny_weights / W.CHECKPOINT_NAME, weights_only=True)
    assert set(ckpt) == set(W.COMPONENTS)
    assert all(k.startswith("module.") for k in ckpt["decoder"])  # as in the published checkpoint
    voice = torch.load(tiny_weights / "voices" / "syn_a.pt", weights_only=True)
    assert tuple(voice.shape) == (510, 1, 256)
    # upstream's own loader takes it without falling back to random init
    W.validate_weights_dir(tiny_weights, ["syn_a"], tiny_weights.parent)


def test_synthetic_is_deterministic(tiny_weights, tmp_path):
    again = materialize_weights("kokoro", {"source": "synthetic", "preset": "kokoro-tiny", "seed": 0}, tmp_path / "w")
    assert again["files"][W.CHECKPOINT_NAME] == tree_sha256(tiny_weights / W.CHECKPOINT_NAME)


def test_synthetic_does_not_depend_on_the_callers_torch_threads(tiny_weights, tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as a runtime loaded with threads=1 leaves the process
    try:
        again = materialize_weights("kokoro", {"source": "synthetic", "preset": "kokoro-tiny", "seed": 0}, tmp_path / "w")
        assert torch.get_num_threads() == 1  # restored
    finally:
        torch.set_num_threads(before)
    assert again["files"][W.CHECKPOINT_NAME] == tree_sha256(tiny_weights / W.CHECKPOINT_NAME)


@pytest.mark.parametrize("case, message", [
    ("missing", "missing tensor decoder.generator.conv_post.bias"),
    ("extra", "unexpected tensor predictor.bogus"),
    ("shape", "tensor bert_encoder.weight has shape"),
    ("nan", "tensor predictor.F0_proj.weight contains NaN or inf"),
    ("component", "missing components ['text_encoder']"),
])
def test_bad_checkpoint_names_the_tensor(tiny_weights, tmp_path, case, message):
    bad = _copy(tiny_weights, tmp_path / "bad")

    def edit(ckpt):
        if case == "missing":
            del ckpt["decoder"]["module.generator.conv_post.bias"]
        elif case == "extra":
            ckpt["predictor"]["module.bogus"] = torch.zeros(3)
        elif case == "shape":
            ckpt["bert_encoder"]["module.weight"] = torch.zeros(5, 5)
        elif case == "nan":
            ckpt["predictor"]["module.F0_proj.weight"][0, 0, 0] = float("nan")
        else:
            del ckpt["text_encoder"]

    _edit_checkpoint(bad, edit)
    with pytest.raises(W.WeightsError, match=None) as err:
        W.validate_weights_dir(bad, ["syn_a"], tmp_path)
    assert message in str(err.value)


def test_missing_files_are_named(tiny_weights, tmp_path):
    bad = _copy(tiny_weights, tmp_path / "bad")
    (bad / W.CHECKPOINT_NAME).unlink()
    with pytest.raises(W.WeightsError, match="missing weight file: .*kokoro-v1_0.pth"):
        W.validate_weights_dir(bad, [], tmp_path)
    with pytest.raises(W.WeightsError, match="missing voice file: .*af_heart.pt"):
        W.validate_weights_dir(tiny_weights, ["af_heart"], tmp_path)


def test_local_source_copies_and_validates(tiny_weights, tmp_path):
    record = materialize_weights("kokoro", {"source": "local", "path": str(tiny_weights), "voices": ["syn_b"]},
                                 tmp_path / "out" / "weights")
    assert (tmp_path / "out" / "weights" / "voices" / "syn_b.pt").is_file()
    assert record["voices"] == ["syn_b"]
    with pytest.raises(WeightsSourceError, match="missing weight file: .*voices/af_heart.pt"):
        materialize_weights("kokoro", {"source": "local", "path": str(tiny_weights)}, tmp_path / "out2" / "weights")
    assert not (tmp_path / "out2" / "weights").exists(), "a failed source must leave no weights dir"


def _fake_hub_cache(cache: Path, weights_dir: Path, voices: list[str]) -> None:
    """The on-disk layout huggingface_hub writes for a download at a pinned revision."""
    repo = cache / f"models--{HF_REPO.replace('/', '--')}"
    snap = repo / "snapshots" / REVISION
    for name in ["config.json", W.CHECKPOINT_NAME, *[f"voices/{v}.pt" for v in voices]]:
        src = weights_dir / (name if not name.startswith("voices/af_heart") else "voices/syn_a.pt")
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, snap / name)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)


def test_hf_source_offline_from_cache(tiny_weights, tmp_path, monkeypatch, hf_offline):
    import huggingface_hub.constants as C

    cache = tmp_path / "hub"
    _fake_hub_cache(cache, tiny_weights, ["af_heart"])
    monkeypatch.setattr(C, "HF_HUB_CACHE", str(cache))
    src = {"source": "hf", "repo_id": HF_REPO, "revision": REVISION, "voices": ["af_heart"]}
    record = materialize_weights("kokoro", src, tmp_path / "m" / "weights")
    assert record["revision"] == REVISION
    assert (tmp_path / "m" / "weights" / "voices" / "af_heart.pt").is_file()

    missing = dict(src, revision="0" * 40)
    with pytest.raises(WeightsSourceError, match="unreachable"):
        materialize_weights("kokoro", missing, tmp_path / "n" / "weights")
    assert not (tmp_path / "n" / "weights").exists()
