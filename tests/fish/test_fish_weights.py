"""Fish weights: the published layout and its dimensions, synthesis, validation naming the tensor, sources."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from anetts.models.fish import weights as W
from anetts.models.fish.config import FishConfig, FishConfigError
from anetts.models.fish.presets import preset
from anetts.models.fish.tokenizer import TOKENIZER_NAME, TokenizerError, load_tokenizer
from anetts.weights import WeightsSourceError, materialize_weights

REVISION = "1" * 40  # any pinned sha: the fake hub cache below is keyed by it


def _s2_spec():
    cfg = FishConfig.from_dict(preset("fish-s2-pro").config)
    return cfg, W.checkpoint_spec(cfg)


def test_s2_pro_spec_has_the_published_dimensions():
    cfg, spec = _s2_spec()
    s = cfg.slow
    assert (s.n_layer, s.dim, s.n_head, s.n_local_heads, s.head_dim, s.intermediate_size, s.vocab_size) == \
        (36, 2560, 32, 8, 128, 9728, 155_776)
    assert (cfg.semantic_begin_id, cfg.semantic_end_id, cfg.im_end_id, cfg.pad_token_id, cfg.audio_pad_token_id) == \
        (151_678, 155_773, 151_645, 151_669, 151_677)
    slow = [n for n in spec if n.startswith("text_model.model.") and n != "text_model.model.embeddings.weight"]
    assert len(slow) == 325  # 36 x 9 + norm
    per_layer = sum(math.prod(spec[n]) for n in spec if n.startswith("text_model.model.layers.0."))
    assert per_layer == 100_930_816
    assert spec["text_model.model.layers.0.attention.wqkv.weight"] == (6144, 2560)
    assert spec["text_model.model.layers.0.attention.wo.weight"] == (2560, 4096)
    assert spec["audio_decoder.codebook_embeddings.weight"] == (40_960, 2560)
    fast = [n for n in spec if n.startswith("audio_decoder.")
            and n not in ("audio_decoder.embeddings.weight", "audio_decoder.codebook_embeddings.weight")]
    assert len(fast) == 30
    total = sum(math.prod(v) for v in spec.values())
    assert abs(total / 1e9 - 4.56) < 0.01, total


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["text_config"].pop("head_dim"), "missing key text_config.head_dim"),
    (lambda c: c.update(model_type="dual_ar"), "model_type is 'dual_ar'"),
    (lambda c: c["audio_decoder_config"].update(vocab_size=100), "audio_decoder_config.vocab_size is 100"),
    (lambda c: c["text_config"].update(n_local_heads=3), "not a multiple of n_local_heads 3"),
    (lambda c: c["text_config"].update(use_moe=True), "use_moe"),
])
def test_bad_config_names_the_key(edit, message):
    cfg = preset("fish-tiny").config
    edit(cfg)
    with pytest.raises(FishConfigError, match=None) as err:
        FishConfig.from_dict(cfg)
    assert message in str(err.value)


def test_fish_tiny_layout_and_scales(fish_tiny):
    cfg = W.validate_weights_dir(fish_tiny)
    s = cfg.slow
    assert s.n_head * s.head_dim != s.dim and s.gqa_group == 4 and s.qk_norm and cfg.num_codebooks == 10
    assert 2 <= s.n_layer <= 4
    index = json.loads((fish_tiny / W.INDEX_NAME).read_text())
    assert len(set(index["weight_map"].values())) >= 2  # the index is exercised
    state = W.load_state(fish_tiny, dtype=torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in state.values())
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in state.values())
    norms = torch.cat([t.float() for n, t in state.items() if n.endswith("norm.weight")])
    assert abs(norms.mean() - 1) < 0.02 and 0.05 < norms.std() < 0.2
    wqkv = state["text_model.model.layers.0.attention.wqkv.weight"].float()
    assert abs(wqkv.std() - s.dim ** -0.5) < 0.1 * s.dim ** -0.5
    # tokenizer: every string encodes (byte level), specials sit at the config's ids
    tk = load_tokenizer(fish_tiny / TOKENIZER_NAME, cfg)
    text = "Grüße, 世界! <|im_end|>"
    ids = tk.encode(text, add_special_tokens=False).ids
    assert ids[-1] == cfg.im_end_id and tk.decode(ids, skip_special_tokens=False) == text


def test_synthesis_is_deterministic(fish_tiny, tmp_path):
    again = materialize_weights("fish", {"source": "synthetic", "preset": "fish-tiny", "seed": 0}, tmp_path / "w")
    first = json.loads((fish_tiny / "source.json").read_text())
    assert again["files"] == first["files"]
    other = materialize_weights("fish", {"source": "synthetic", "preset": "fish-tiny", "seed": 1}, tmp_path / "w1")
    shard = "model-00001-of-00004.safetensors"
    assert other["files"][shard] != first["files"][shard]
    assert other["files"]["codec.pth"] != first["files"]["codec.pth"]  # the codec follows the seed too


def _rewrite(weights_dir: Path, name: str, tensor: torch.Tensor | None) -> None:
    """Replace (or with None, drop) one tensor in its shard, keeping the index as it was."""
    shard = W.read_index(weights_dir)[name]
    with safe_open(str(weights_dir / shard), framework="pt") as fh:
        state = {k: fh.get_tensor(k) for k in fh.keys()}
    if tensor is None:
        del state[name]
    else:
        state[name] = tensor
    save_file(state, str(weights_dir / shard))


WQKV = "text_model.model.layers.1.attention.wqkv.weight"
KNORM = "text_model.model.layers.2.attention.k_norm.weight"


@pytest.mark.parametrize("case, message", [
    ("missing", f"missing tensor {KNORM}"),
    ("unindexed", f"missing tensor {WQKV}"),
    ("shape", f"tensor {WQKV} has shape (10, 256), expected (768, 256)"),
    ("dtype", f"tensor {KNORM} has dtype F32, expected BF16"),
    ("nan", f"tensor {WQKV} contains NaN or inf"),
    ("extra", "unexpected tensor text_model.model.layers.9.bogus.weight"),
    ("tokenizer", "token <|im_end|> has id"),
])
def test_bad_weights_name_the_tensor(fish_tiny, tmp_path, case, message):
    bad = shutil.copytree(fish_tiny, tmp_path / "bad")
    if case == "missing":
        _rewrite(bad, KNORM, None)
    elif case == "unindexed":
        index = json.loads((bad / W.INDEX_NAME).read_text())
        del index["weight_map"][WQKV]
        (bad / W.INDEX_NAME).write_text(json.dumps(index))
    elif case == "shape":
        _rewrite(bad, WQKV, torch.zeros(10, 256, dtype=torch.bfloat16))
    elif case == "dtype":
        _rewrite(bad, KNORM, torch.ones(64))
    elif case == "nan":
        t = W.load_state(bad, torch.bfloat16)[WQKV].clone()
        t[3, 5] = float("nan")
        _rewrite(bad, WQKV, t)
    elif case == "extra":
        index = json.loads((bad / W.INDEX_NAME).read_text())
        index["weight_map"]["text_model.model.layers.9.bogus.weight"] = "model-00001-of-00004.safetensors"
        (bad / W.INDEX_NAME).write_text(json.dumps(index))
    else:
        cfg = json.loads((bad / "config.json").read_text())
        cfg["eos_token_id"] = cfg["pad_token_id"]
        (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises((W.WeightsError, TokenizerError)) as err:
        W.validate_weights_dir(bad)
    assert message in str(err.value)


def test_local_source_copies_and_validates(fish_tiny, tmp_path):
    record = materialize_weights("fish", {"source": "local", "path": str(fish_tiny)}, tmp_path / "a" / "weights")
    assert record["files"] == {k: v for k, v in json.loads((fish_tiny / "source.json").read_text())["files"].items()}
    broken = shutil.copytree(fish_tiny, tmp_path / "broken")
    (broken / "model-00002-of-00004.safetensors").unlink()
    with pytest.raises(WeightsSourceError, match="missing weight file: .*model-00002-of-00004.safetensors"):
        materialize_weights("fish", {"source": "local", "path": str(broken)}, tmp_path / "b" / "weights")
    assert not (tmp_path / "b" / "weights").exists(), "a failed source must leave no weights dir"


def _fake_hub_cache(cache: Path, weights_dir: Path) -> None:
    """The on-disk layout huggingface_hub writes for a download at a pinned revision."""
    repo = cache / f"models--{W.HF_REPO.replace('/', '--')}"
    snap = repo / "snapshots" / REVISION
    snap.mkdir(parents=True)
    for f in weights_dir.iterdir():
        if f.name != "source.json":
            shutil.copyfile(f, snap / f.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)


def test_hf_source_offline_from_cache(fish_tiny, tmp_path, monkeypatch, hf_offline):
    import huggingface_hub.constants as C

    _fake_hub_cache(tmp_path / "hub", fish_tiny)
    monkeypatch.setattr(C, "HF_HUB_CACHE", str(tmp_path / "hub"))
    src = {"source": "hf", "repo_id": W.HF_REPO, "revision": REVISION}
    record = materialize_weights("fish", src, tmp_path / "m" / "weights")
    assert record["revision"] == REVISION and (tmp_path / "m" / "weights" / W.INDEX_NAME).is_file()
    with pytest.raises(WeightsSourceError, match="unreachable"):
        materialize_weights("fish", dict(src, revision="0" * 40), tmp_path / "n" / "weights")
    with pytest.raises(WeightsSourceError, match="pinned 40-hex commit revision"):
        materialize_weights("fish", dict(src, revision="main"), tmp_path / "n" / "weights")
    assert not (tmp_path / "n" / "weights").exists()
