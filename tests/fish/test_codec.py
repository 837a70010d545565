"""The Fish codec stage: the synthetic codec.pth is upstream's layout, bad weights are named, the
decoder is causal (padding never reaches the valid samples, eager and compiled), and one tiny
bucket exports, converts and passes parity against upstream's decoder."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from anetts.models.fish import codec as C
from anetts.models.fish.stages.codec import CodecStage, example_codes

FRAMES, VALID = 8, 5


@pytest.fixture(scope="module")
def upstream_codec(fish_tiny):
    return C.load_codec(fish_tiny)


def _padded(cfg, seed_pad: int | None):
    """Codes (1, 10, FRAMES): VALID frames of seed 0, then zeros or (seed_pad) random codes."""
    codes = example_codes(cfg, FRAMES, VALID)
    if seed_pad is not None:
        codes[:, VALID:] = example_codes(cfg, FRAMES - VALID, FRAMES - VALID, seed=seed_pad)
    return codes[None]


def test_synthetic_codec_pth_is_upstreams_layout(fish_tiny):
    cfg = C.read_codec_config(fish_tiny)
    model = C.build_dac(cfg)
    state = torch.load(fish_tiny / C.CODEC_NAME, weights_only=True)
    result = model.load_state_dict(state, strict=False)
    assert not result.unexpected_keys
    assert result.missing_keys and all(k.rsplit(".", 1)[-1] in C.DROPPED_BUFFERS for k in result.missing_keys)
    # both weight-norm spellings of the real file: modded_dac's parametrizations, dac's weight_g/v
    assert "decoder.model.0.conv.parametrizations.weight.original0" in state
    assert "quantizer.semantic_quantizer.quantizers.0.out_proj.weight_g" in state
    assert "encoder.block.0.conv.parametrizations.weight.original1" in state  # the encoder is in the file
    assert cfg["decoder_rates"] == [8, 8, 4, 2] and cfg["quantizer"]["downsample_factor"] == [2, 2]


def test_upstream_checkpoint_wrappers_read_the_same(fish_tiny, tmp_path):
    """A `state_dict` wrapper with `generator.` keys and stray RoPE buffers, as training checkpoints
    have them, reads as the plain file (upstream inference.load_model's unwrapping)."""
    state = C.read_state(fish_tiny / C.CODEC_NAME)
    wrapped = {f"generator.{k}": v for k, v in state.items()}
    wrapped["generator.quantizer.post_module.freqs_cis"] = torch.zeros(7, 3)
    torch.save({"state_dict": wrapped}, tmp_path / C.CODEC_NAME)
    again = C.read_state(tmp_path / C.CODEC_NAME)
    assert again.keys() == state.keys() and all(torch.equal(again[k], state[k]) for k in state)


def test_decode_gives_2048_samples_per_frame(upstream_codec):
    cfg = upstream_codec.codec_config
    audio = C.upstream_decode(upstream_codec, example_codes(cfg, 4, 4))
    assert audio.shape == (4 * 2048,) and np.isfinite(audio).all()
    assert 0.005 < audio.std() < 1.0  # audible, not saturated (tanh output)


def _edit_codec(src, dst, edit):
    shutil.copytree(src, dst)
    state = torch.load(dst / C.CODEC_NAME, weights_only=True)
    edit(state)
    torch.save(state, dst / C.CODEC_NAME)
    return dst


NAME = "decoder.model.1.block.1.conv.parametrizations.weight.original1"


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.pop(NAME), f"missing tensor {NAME}"),
    (lambda s: s.__setitem__(NAME, s[NAME][:, :-1]), f"tensor {NAME} has shape"),
    (lambda s: s[NAME].view(-1).__setitem__(3, float("nan")), f"tensor {NAME} contains NaN or inf"),
    (lambda s: s.__setitem__("decoder.extra.weight", torch.zeros(2)), "unexpected tensor decoder.extra.weight"),
])
def test_bad_codec_weights_name_the_tensor(fish_tiny, tmp_path, edit, message):
    from anetts.families import get_family
    from anetts.models.fish.weights import WeightsError

    bad = _edit_codec(fish_tiny, tmp_path / "w", edit)
    with pytest.raises(C.CodecError, match=message):
        C.validate_codec(bad)
    with pytest.raises(WeightsError, match=message):  # what materialize_weights runs for every source
        get_family("fish").validate_weights(bad, [], tmp_path)


def test_a_local_source_copies_the_codec_and_refuses_one_without(fish_tiny, tmp_path):
    from anetts.weights import WeightsSourceError, materialize_weights

    record = materialize_weights("fish", {"source": "local", "path": str(fish_tiny)}, tmp_path / "copy")
    assert "codec.pth" in record["files"]
    assert C.read_codec_config(tmp_path / "copy") == C.read_codec_config(fish_tiny)  # tiny: from config.json
    bare = tmp_path / "bare"
    shutil.copytree(fish_tiny, bare)
    (bare / C.CODEC_NAME).unlink()
    with pytest.raises(WeightsSourceError, match="missing weight file: .*codec.pth"):
        materialize_weights("fish", {"source": "local", "path": str(bare)}, tmp_path / "w")


def test_missing_codec_and_mismatched_config_are_named(fish_tiny, tmp_path):
    w = tmp_path / "w"
    shutil.copytree(fish_tiny, w)
    (w / C.CODEC_NAME).unlink()
    with pytest.raises(C.CodecError, match="missing weight file: .*codec.pth"):
        C.validate_codec(w)
    cfg = C.read_codec_config(fish_tiny)
    with pytest.raises(C.CodecError, match="semantic_codebook_size 512 is not the AR's codebook_size 4096"):
        C.check_config(cfg, 10, 4096)
    with pytest.raises(C.CodecError, match="2048 samples per frame"):
        C.check_config({**cfg, "decoder_rates": [8, 8, 4, 4]})


def test_the_wrapper_is_upstream_and_padding_never_reaches_the_valid_samples(upstream_codec):
    cfg = upstream_codec.codec_config
    wrapper = CodecStage().build(upstream_codec)
    with torch.no_grad():
        zeros, noise = (wrapper(torch.from_numpy(_padded(cfg, s))).numpy()[0] for s in (None, 7))
    n = VALID * 2048
    alone = C.upstream_decode(upstream_codec, _padded(cfg, None)[0, :, :VALID])  # upstream, no padding at all
    np.testing.assert_allclose(zeros[:n], alone, rtol=0, atol=1e-6)
    np.testing.assert_allclose(noise[:n], alone, rtol=0, atol=1e-6)
    assert np.abs(zeros[n:] - noise[n:]).max() > 1e-3  # the padding itself did change what follows


@pytest.fixture(scope="module")
def codec_build(fish_tiny, tmp_path_factory):
    """fish-tiny's codec at one bucket: exported, converted (the config's fp16 / macOS15 options)."""
    from anetts.compile.convert import ConvertOptions, convert_export
    from anetts.compile.export import export_stage
    from anetts.families import get_family

    d = tmp_path_factory.mktemp("codec")
    export_stage(get_family("fish"), "codec", "f8", FRAMES, None, fish_tiny, None, d / "f8.functions",
                 d / "f8.scenario.npz", d / "f8.export.json")
    opts = ConvertOptions.make(deployment_target="macOS15", precision="fp16", compute_units="CPU_AND_GPU")
    convert_export(d / "f8.functions", d / "f8.export.json", d / "f8.mlpackage", d / "f8.json", opts,
                   {"model": "fish-tiny", "family": "fish"})
    return d


def test_codec_bucket_passes_parity_against_upstream(codec_build):
    from anetts.options import Gate
    from anetts.verify.parity import run_parity

    d = codec_build
    export = json.loads((d / "f8.export.json").read_text())
    (spec,) = export["functions"]
    assert export["bucket"] == "f8" and spec["inputs"][0] == {
        "name": "codes", "shape": [1, 10, 8], "dtype": "int32", "description": spec["inputs"][0]["description"]}
    assert spec["outputs"][0]["shape"] == [1, 8 * 2048]
    assert export["geometry"] == {"frames": 8, "samples": 8 * 2048, "samples_per_frame": 2048, "sample_rate": 44100,
                                  "codes_per_frame": 10}
    report = run_parity(d / "f8.mlpackage", d / "f8.scenario.npz", d / "f8.export.json", Gate.make())
    assert report["valid_regions"] == {"audio": [1, 6 * 2048]}  # the example leaves 2 padding frames
    mil = report["backends"]["mil"]
    assert report["passed"] and mil["min_snr_db"] >= 35, mil
    conv = json.loads((d / "f8.json").read_text())
    assert conv["precision"] == "fp16" and conv["deployment_target"] == "macOS15"


def test_compiled_codec_ignores_padding_too(codec_build, upstream_codec):
    from anetts.mil import load_program

    program = load_program(codec_build / "f8.mlpackage")
    cfg = upstream_codec.codec_config
    zeros, noise = (program.run({"codes": _padded(cfg, s).astype(np.int32)})["audio"].reshape(-1) for s in (None, 7))
    n = VALID * 2048
    np.testing.assert_allclose(noise[:n], zeros[:n], rtol=0, atol=1e-6)
    assert np.abs(zeros[n:] - noise[n:]).max() > 1e-3
