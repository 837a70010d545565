"""Per-layer loader: layers [a, b) come from the shards alone, nothing else is read, values match."""
from __future__ import annotations

import pytest
import torch

from anetts.models.fish import loader, reference as R, weights as W


class _Spy:
    """Wraps safetensors.safe_open to record every shard opened and every tensor read."""

    def __init__(self, real):
        self.real, self.opened, self.read = real, [], []

    def __call__(self, path, framework="pt", device="cpu"):
        spy = self
        self.opened.append(path.rsplit("/", 1)[-1])
        inner = self.real(path, framework=framework, device=device)

        class Handle:
            def __enter__(self):
                self.h = inner.__enter__()
                return self

            def __exit__(self, *exc):
                return inner.__exit__(*exc)

            def keys(self):
                return self.h.keys()

            def get_tensor(self, name):
                spy.read.append(name)
                return self.h.get_tensor(name)

        return Handle()


def test_loads_only_the_requested_layers(fish_tiny, monkeypatch):
    import safetensors

    full = W.load_state(fish_tiny, dtype=torch.bfloat16)
    spy = _Spy(safetensors.safe_open)
    monkeypatch.setattr(safetensors, "safe_open", spy)
    got = loader.load_slow_layers(fish_tiny, 1, 3)

    cfg = W.read_config(fish_tiny)
    wanted = loader.slow_layer_names(cfg, 1, 3)
    assert len(wanted) == 2 * 9
    assert sorted(spy.read) == sorted(wanted), "read a tensor outside layers [1, 3)"
    index = W.read_index(fish_tiny)
    assert set(spy.opened) == {index[n] for n in wanted}, "opened a shard holding none of the layers"
    assert set(got) == {n[len(W.SLOW_PREFIX):] for n in wanted}  # fish-speech module names, no norm
    for name in wanted:
        assert torch.equal(got[name[len(W.SLOW_PREFIX):]], full[name]), name


def test_last_chunk_brings_the_final_norm(fish_tiny, fish_reference):
    model = fish_reference[0]
    got = loader.load_slow_layers(fish_tiny, 2, 4, dtype=torch.float32)
    assert "norm.weight" in got and not any(k.startswith(("layers.0.", "layers.1.")) for k in got)
    ref = R.stored_tensors(model)  # the upstream model, loaded from all shards at once
    for name, tensor in got.items():
        assert torch.equal(tensor, ref[name].float()), name


def test_bad_range_is_refused(fish_tiny):
    with pytest.raises(ValueError, match=r"slow layer range \[3, 9\) is outside 0..4"):
        loader.load_slow_layers(fish_tiny, 3, 9)


def test_mapped_checkpoint_views_equal_the_loaded_tensors_and_refuse_a_truncated_shard(fish_tiny, tmp_path):
    """Every mapped view is the checkpoint's tensor to the bit; a shard cut short is refused when it is
    mapped, naming the shard and the tensor that runs past its end (nothing is read off the end)."""
    import shutil

    mapped = loader.MappedCheckpoint(fish_tiny)
    loaded = W.load_state(fish_tiny, dtype=torch.bfloat16)
    assert set(mapped.tensors) == set(loaded)
    assert all(torch.equal(mapped.tensors[n], t) for n, t in loaded.items())

    bad = tmp_path / "weights"
    shutil.copytree(fish_tiny, bad)
    shard = W.shard_files(bad)[-1]
    header, start = W.shard_header(bad / shard)
    last = max(header, key=lambda n: header[n]["data_offsets"][1])
    with open(bad / shard, "r+b") as fh:
        fh.truncate(start + header[last]["data_offsets"][1] - 2)
    with pytest.raises(W.WeightsError, match=f"{shard}: tensor {last} runs past the end of the file"):
        loader.MappedCheckpoint(bad)
