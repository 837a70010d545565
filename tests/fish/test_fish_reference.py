"""The upstream reference on fish-tiny: strict load, deterministic decode, and first logits equal to an
independent float64 forward from the raw tensors (which a half-split RoPE fails)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from anetts.models.fish import oracle, reference as R, weights as W


def test_every_checkpoint_tensor_maps_to_an_upstream_parameter(fish_tiny, fish_reference):
    model = fish_reference[0]
    names = set(W.read_index(fish_tiny))
    weights = {k for k in model.state_dict() if ".kv_cache." not in k}  # caches are runtime buffers
    assert {R.from_s2_key(n) for n in names} == weights  # the strict load covered them all
    assert R.from_s2_key("audio_decoder.codebook_embeddings.weight") == "codebook_embeddings.weight"
    assert R.from_s2_key("audio_decoder.layers.1.attention.wqkv.weight") == "fast_layers.1.attention.wqkv.weight"


def test_reference_decode_is_deterministic_and_saved(fish_tiny, fish_reference, tmp_path):
    model, cfg, prompt, first = fish_reference
    F = R.REFERENCE_FRAMES
    assert first["codes"].shape == (F, cfg.num_codebooks)
    assert first["fast_logits"].shape == (F, cfg.num_codebooks, cfg.codebook_size)
    assert first["prefill_layer_hidden"].shape == (cfg.slow.n_layer + 1, prompt.shape[1], cfg.slow.dim)
    assert list(first["positions"]) == [prompt.shape[1] - 1 + f for f in range(F)]
    # the prompt mixes text and 10-codebook semantic frames; decoding runs at positions well past 0
    semantic = (prompt[0] >= cfg.semantic_begin_id) & (prompt[0] <= cfg.semantic_end_id)
    assert semantic.sum() >= 8 and (prompt[1:, semantic] > 0).any() and prompt.shape[1] > 100
    assert ((first["semantic_tokens"] >= cfg.semantic_begin_id) | (first["semantic_tokens"] == cfg.im_end_id)).all()
    assert (first["codes"][:, 0] == first["semantic_tokens"] - cfg.semantic_begin_id).all()
    assert len(set(first["codes"][:, 1:].ravel().tolist())) > 5  # fast AR codes are not degenerate

    saved = R.write_reference(fish_tiny, tmp_path / "ref" / "fish-tiny.npz")
    on_disk = np.load(tmp_path / "ref" / "fish-tiny.npz")
    for key, value in first.items():
        assert np.array_equal(saved[key], value), f"second run differs in {key}"
        assert np.array_equal(on_disk[key], value), f"saved npz differs in {key}"
    assert not list((tmp_path / "ref").glob(".*")), "temp file left behind"


@pytest.fixture(scope="module")
def raw_state(fish_tiny):
    return W.load_state(fish_tiny, dtype=torch.float32)


def test_first_logits_equal_an_independent_forward(fish_reference, raw_state):
    model, cfg, prompt, ref = fish_reference
    scale = float(np.abs(ref["slow_logits"][0]).max())
    right = oracle.slow_prefill(raw_state, cfg, torch.from_numpy(prompt), rope="interleaved")
    err = np.abs(right["logits"].numpy() - ref["slow_logits"][0]).max()
    assert err < 1e-4 * scale, f"reference vs float64 oracle: max |d logits| {err:.3g} (scale {scale:.3g})"
    # the fast AR is fed the final-normed state, the same vector the head reads
    assert np.abs(right["hidden"].numpy() - ref["slow_hidden"][0]).max() < 1e-4
    # half-split RoPE is equivalent only with q/k rows and q/k norms permuted per head
    perm = oracle.slow_prefill(raw_state, cfg, torch.from_numpy(prompt), rope="half_split_permuted")
    assert np.abs(perm["logits"].numpy() - ref["slow_logits"][0]).max() < 1e-4 * scale


def test_half_split_rope_fails_the_comparison(fish_reference, raw_state):
    model, cfg, prompt, ref = fish_reference
    wrong = oracle.slow_prefill(raw_state, cfg, torch.from_numpy(prompt), rope="half_split")
    err = np.abs(wrong["logits"].numpy() - ref["slow_logits"][0]).max()
    assert err > 0.05 * float(np.abs(ref["slow_logits"][0]).max()), f"half-split RoPE went unnoticed ({err:.3g})"


def test_pre_norm_fast_input_changes_the_codes(fish_tiny, fish_reference):
    """Adaptation 3 matters: fish-speech 0.1.0 as shipped (pre-norm fast input) decodes other codes."""
    from fish_speech.models.text2semantic.llama import DualARTransformer

    model, cfg, prompt, ref = fish_reference
    plain = DualARTransformer(R.model_args(cfg), tokenizer=R.SemanticIds(cfg))
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if ".kv_cache." not in k})
    out = R.reference_decode(plain.eval(), cfg, prompt, n_frames=2)
    assert np.allclose(out["slow_logits"][0], ref["slow_logits"][0], atol=1e-5)  # slow logits agree...
    assert not np.array_equal(out["codes"], ref["codes"][:2])  # ...the codes do not


def test_fast_ar_equals_an_independent_parallel_forward(fish_reference, raw_state):
    """Every frame's 10 cached fast passes equal one causal pass over [slow state, emb(codes 0..8)]."""
    model, cfg, prompt, ref = fish_reference
    for f in range(0, R.REFERENCE_FRAMES, 5):  # frames 0, 5, 10, 15
        logits = oracle.fast_frame(raw_state, cfg, torch.from_numpy(ref["slow_hidden"][f]),
                                   torch.from_numpy(ref["codes"][f])).numpy()
        err = np.abs(logits - ref["fast_logits"][f]).max()
        assert err < 1e-4 * np.abs(ref["fast_logits"][f]).max(), f"frame {f}: max |d fast logits| {err:.3g}"
        assert (logits[1:].argmax(-1) == ref["codes"][f, 1:]).all()  # position i >= 1 predicts codebook i


def test_adaptation_agrees_with_the_native_mlx_port(fish_tiny, fish_reference):
    """mlx-audio's own S2 implementation decodes the same greedy codes for all reference frames."""
    from anetts.models.fish.crosscheck import mlx_decode

    model, cfg, prompt, ref = fish_reference
    assert R.REFERENCE_FRAMES >= 16
    other = mlx_decode(fish_tiny, prompt, R.REFERENCE_FRAMES)
    assert np.array_equal(other["semantic_tokens"], ref["semantic_tokens"])
    assert np.array_equal(other["codes"], ref["codes"])
    assert np.abs(other["slow_logits"] - ref["slow_logits"]).max() < 1e-4 * np.abs(ref["slow_logits"]).max()
    assert np.abs(other["fast_logits"] - ref["fast_logits"]).max() < 1e-4 * np.abs(ref["fast_logits"]).max()
