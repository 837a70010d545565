"""Each stage wrapper, on a padded bucket, reproduces upstream KModel on the valid region."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from anetts.families import get_family
from anetts.models.kokoro.reference import (example_for_seconds, example_token_ids, upstream_frames,
                                            upstream_intermediates)

FAMILY = get_family("kokoro")


def _run(stage_name, model, inputs):
    stage = FAMILY.stage(stage_name)
    module = stage.build(model)
    with torch.no_grad():
        out = module(*[torch.from_numpy(v) for v in inputs.values()])
    return out if isinstance(out, tuple) else (out,)


@pytest.fixture(scope="module")
def reference_3s(tiny_model, tiny_weights):
    return example_for_seconds(tiny_model, tiny_weights, 3, "syn_a")


def test_reference_fills_part_of_the_bucket(reference_3s):
    frames = int(reference_3s["pred_dur"].sum())
    assert 0.3 * 120 < frames <= 120
    # synthetic weights are calibrated to real durations (≈2.8 frames/token), not random init's ≈25
    assert 1.5 < frames / len(reference_3s["pred_dur"]) < 5


def test_the_example_search_counts_frames_without_decoding(tiny_model, reference_3s):
    """The search for a bucket's example needs only each candidate's frame count: upstream's forward
    stopped before F0/N and the decoder, the count its full forward gives."""
    decoded = []
    hook = tiny_model.decoder.register_forward_pre_hook(lambda _m, _a: decoded.append(1))
    ref_s = torch.from_numpy(reference_3s["ref_s"])
    try:
        for n_tokens in (8, 30, 60):
            ids = example_token_ids(tiny_model.vocab, n_tokens)
            frames = upstream_frames(tiny_model, ids, ref_s)
            assert not decoded
            assert frames == int(upstream_intermediates(tiny_model, ids, ref_s)["pred_dur"].sum())
            decoded.clear()
        # the example itself: its text's full forward, whose frames fit the bucket
        ids = reference_3s["input_ids"].tolist()
        assert upstream_frames(tiny_model, ids, ref_s) == int(reference_3s["pred_dur"].sum())
    finally:
        hook.remove()
    assert not tiny_model.predictor.shared._forward_pre_hooks  # the stop hook is gone


def test_duration_matches_upstream(tiny_model, tiny_weights):
    stage = FAMILY.stage("duration")
    inputs = stage.example_inputs(tiny_model, tiny_weights, 64)
    n = int(inputs["attention_mask"].sum())
    assert 0 < n < 64, "example must leave padding so masks are exercised"
    pred_dur, d, t_en, s, ref_s_out = _run("duration", tiny_model, inputs)
    ids = inputs["input_ids"][0, :n].tolist()
    ref = upstream_intermediates(tiny_model, ids, torch.from_numpy(inputs["ref_s"]))
    np.testing.assert_array_equal(pred_dur.numpy()[0, :n], ref["pred_dur"])
    assert (pred_dur.numpy()[0, n:] == 0).all()
    # en = d^T aligned; compare d through upstream's alignment of the first frames
    idx = np.repeat(np.arange(n), ref["pred_dur"])
    np.testing.assert_allclose(d.numpy()[0, :n][idx].T[None], ref["en"], atol=1e-4)
    np.testing.assert_allclose(ref_s_out.numpy(), inputs["ref_s"])


def test_f0ntrain_matches_upstream(tiny_model, tiny_weights, reference_3s):
    inputs = FAMILY.stage("f0ntrain").example_inputs(tiny_model, tiny_weights, 3, reference_3s)
    f0, n = _run("f0ntrain", tiny_model, inputs)
    valid = reference_3s["F0"].shape[-1]
    np.testing.assert_allclose(f0.numpy()[:, :valid], reference_3s["F0"], atol=2e-3, rtol=1e-5)
    np.testing.assert_allclose(n.numpy()[:, :valid], reference_3s["N"], atol=1e-4)
    assert not f0.numpy()[:, valid:].any(), "padding must come out zero"


def test_decoder_pre_matches_upstream(tiny_model, tiny_weights, reference_3s):
    inputs = FAMILY.stage("decoder_pre").example_inputs(tiny_model, tiny_weights, 3, reference_3s)
    (x_pre,) = _run("decoder_pre", tiny_model, inputs)
    valid = reference_3s["x_pre"].shape[-1]
    np.testing.assert_allclose(x_pre.numpy()[..., :valid], reference_3s["x_pre"], atol=1e-4)
    assert not x_pre.numpy()[..., valid:].any()


def test_generator_matches_upstream_istft(tiny_model, tiny_weights, reference_3s):
    """Includes the conv-transpose inverse STFT against upstream's torch.istft."""
    inputs = FAMILY.stage("generator").example_inputs(tiny_model, tiny_weights, 3, reference_3s)
    (wave,) = _run("generator", tiny_model, inputs)
    wave = wave.numpy().reshape(-1)
    audio = reference_3s["audio"]
    assert len(audio) == 600 * int(reference_3s["pred_dur"].sum())
    np.testing.assert_allclose(wave[: len(audio)], audio, atol=1e-5)
    assert not wave[len(audio):].any()


def test_padding_does_not_leak(tiny_model, tiny_weights, reference_3s):
    """Garbage in the padded region must not change the valid region."""
    stage = FAMILY.stage("decoder_pre")
    inputs = stage.example_inputs(tiny_model, tiny_weights, 3, reference_3s)
    valid = int(inputs["mask"].sum())
    noisy = {k: v.copy() for k, v in inputs.items()}
    rng = np.random.default_rng(0)
    noisy["asr"][..., valid:] = rng.normal(size=noisy["asr"][..., valid:].shape)
    noisy["f0"][..., 2 * valid:] = 300.0
    (clean,) = _run("decoder_pre", tiny_model, inputs)
    (dirty,) = _run("decoder_pre", tiny_model, noisy)
    np.testing.assert_allclose(dirty.numpy()[..., : 2 * valid], clean.numpy()[..., : 2 * valid], atol=1e-5)


def test_bucket_specs_follow_geometry():
    spec = FAMILY.stage("generator").function(10)
    shapes = {t.name: t.shape for t in spec.inputs}
    assert shapes["x_pre"] == (1, 512, 800) and shapes["har"] == (1, 22, 48001)
    assert spec.outputs[0].shape == (1, 1, 240000)
    assert FAMILY.stage("duration").bucket_name(128) == "t128"
    assert FAMILY.stage("f0ntrain").bucket_name(7) == "7s"
