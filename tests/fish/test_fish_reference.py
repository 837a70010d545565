"""The upstream reference on fish-tiny: strict load, deterministic decode, first logits equal to an
independent float64 forward from the raw tensors (which a half-split RoPE fails), and the memory-mapped bf16
loading decoding exactly as the full-fp32 model with its reads copied into one reused fp32 arena, and
the checkpoint never held: each read hands its memory-mapped pages back."""
from __future__ import annotations

import mmap
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn.utils import parametrize

from anetts.models.fish import oracle, reference as R, weights as W


def test_every_checkpoint_tensor_maps_to_an_upstream_parameter(fish_tiny, fish_reference):
    model = fish_reference[0]
    names = set(W.read_index(fish_tiny))
    assert {R.from_s2_key(n) for n in names} == set(R.stored_tensors(model))  # the strict load covered them all
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
    # the prefill's every prompt row at the head's rows (the last chunk's `logits`): its last row is frame 0's step
    ids = list(cfg.restricted_ids)
    assert first["prefill_head_logits"].shape == (prompt.shape[1], cfg.n_semantic + 1)
    assert np.array_equal(first["prefill_head_logits"][-1], first["slow_logits"][0][ids])
    assert np.array_equal(first["prefill_slow_hidden"][-1], first["slow_hidden"][0])

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
    from fish_speech.models.text2semantic.llama import BaseTransformer, DualARTransformer

    class AsShipped(DualARTransformer):
        """DualARTransformer.forward_generate, with BaseTransformer's `return_all` passed on (the
        reference's prefill asks for every prompt row's logits)."""

        def forward_generate(self, inp, input_pos=None, audio_masks=None, audio_parts=None, return_all=False):
            r = BaseTransformer.forward_generate(self, inp, input_pos, audio_masks, audio_parts, return_all)
            r.hidden_states = self.fast_project_in(r.hidden_states)
            return r

    model, cfg, prompt, ref = fish_reference
    plain = AsShipped(R.model_args(cfg), tokenizer=R.SemanticIds(cfg))
    plain.load_state_dict({k: v.float() for k, v in R.stored_tensors(model).items()})
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


def full_fp32_model(raw_state, cfg):
    """The reference model as it was loaded before the bf16 one: upstream's S2 model with every
    checkpoint tensor loaded as fp32, `.float()` (18 GB of weights at fish-s2-pro)."""
    model = R.s2_model_class()(R.model_args(cfg), tokenizer=R.SemanticIds(cfg))
    model.load_state_dict({R.from_s2_key(k): v for k, v in raw_state.items()}, strict=True)
    return model.float().eval()


def test_mapped_bf16_model_decodes_exactly_as_the_full_fp32_one(fish_reference, raw_state):
    model, cfg, prompt, ref = fish_reference
    want = R.reference_decode(full_fp32_model(raw_state, cfg), cfg, prompt)
    # a longer decode first: the KV caches are sized anew per decode, so it leaves no trace in the bits
    R.reference_decode(model, cfg, prompt, R.REFERENCE_FRAMES + 8)
    again = R.reference_decode(model, cfg, prompt)
    assert set(ref) == set(want) == set(again)
    for key, value in want.items():
        assert ref[key].dtype == value.dtype and np.array_equal(ref[key], value), f"{key} differs"
        assert np.array_equal(again[key], value), f"{key} differs after a longer decode"


def test_reference_model_keeps_bf16_and_upcasts_one_tensor_at_a_time(fish_reference):
    """Resident weights are the checkpoint's bf16; the fp32 copies alive at any read never sum past the
    largest single tensor's (so at most one block's fp32 weights exist, far less at fish-s2-pro)."""
    model, cfg, prompt, _ = fish_reference
    stored = R.stored_tensors(model)
    assert stored and all(t.dtype == torch.bfloat16 for t in stored.values())
    assert sum(p.nbytes for p in model.parameters() if p.dtype != torch.bfloat16) == 0
    alive: list[weakref.ref] = []
    seen = {"reads": 0, "peak_bytes": 0}

    def on_read(module, args, copy):
        alive[:] = [r for r in alive if r() is not None]
        alive.append(weakref.ref(copy))
        seen["reads"] += 1
        seen["peak_bytes"] = max(seen["peak_bytes"], sum(r().nbytes for r in alive if r() is not None))

    reads = [plist for m in model.modules() if parametrize.is_parametrized(m)
             for plist in m.parametrizations.values()]
    hooks = [plist.register_forward_hook(on_read) for plist in reads]
    try:
        R.reference_decode(model, cfg, prompt, n_frames=2)
    finally:
        for h in hooks:
            h.remove()
    largest = max(t.numel() for t in stored.values()) * 4
    assert len(reads) == len(stored) and seen["reads"] > len(stored)
    assert 0 < seen["peak_bytes"] <= largest, f"{seen['peak_bytes']} B of fp32 weights alive at once > {largest} B"


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="resident bytes per map need Linux's smaps")
def test_reference_model_never_holds_the_checkpoint_only_the_tensor_it_reads(fish_reference):
    """The weights are views of the shards' memory maps, and each read hands its pages back: at every
    read of a decode the process holds (next to) none of the checkpoint, where reading the tensors
    without handing them back leaves all of it resident."""
    model, cfg, prompt, _ = fish_reference
    mapped = model.mapped_checkpoint
    total = sum(t.nbytes for t in mapped.tensors.values())
    views = {t.data_ptr() for t in mapped.tensors.values()}
    assert all(t.data_ptr() in views for t in R.stored_tensors(model).values()), "a weight was copied off the map"
    resident: list[int] = []
    reads = [plist for m in model.modules() if parametrize.is_parametrized(m)
             for plist in m.parametrizations.values()]
    hooks = [plist.register_forward_hook(lambda m, a, out: resident.append(mapped.resident_bytes())) for plist in reads]
    try:
        R.reference_decode(model, cfg, prompt, n_frames=1)
    finally:
        for h in hooks:
            h.remove()
    assert len(resident) > len(reads) and max(resident) <= 2 * mmap.PAGESIZE, max(resident)
    # the measure sees a read that is not handed back: the whole checkpoint, until released
    for t in mapped.tensors.values():
        t.float()
    assert mapped.resident_bytes() >= 0.9 * total
    for t in mapped.tensors.values():
        mapped.release(t)
    assert mapped.resident_bytes() <= 2 * mmap.PAGESIZE


def test_decode_position_tables_are_the_whole_context_ones_cut_to_its_rows(fish_reference):
    """prepare_decode's RoPE tables and causal mask equal the first rows of upstream's whole-context
    ones (fish-tiny's, and the RoPE table at fish-s2-pro's head size and 32768 positions)."""
    from fish_speech.models.text2semantic.llama import precompute_freqs_cis

    model, cfg, prompt, _ = fish_reference
    whole = R.s2_model_class()(R.model_args(cfg), tokenizer=R.SemanticIds(cfg)).float()
    rows = prompt.shape[1] + 3
    R.prepare_decode(model, cfg, rows)
    L = model.max_seq_len
    assert L == rows + (-rows) % 8 and model.layers[0].attention.kv_cache.k_cache.shape[2] == L
    assert torch.equal(model.freqs_cis, whole.freqs_cis[:L]) and model.freqs_cis.dtype == torch.float32
    assert torch.equal(model.causal_mask, whole.causal_mask[:L, :L])
    assert torch.equal(model.fast_freqs_cis, whole.fast_freqs_cis)
    s2 = precompute_freqs_cis(32_768, 128, 1_000_000.0)
    for n in (8, 176, 1000, 4096):
        assert torch.equal(precompute_freqs_cis(n, 128, 1_000_000.0), s2[:n]), n
    with pytest.raises(ValueError, match="does not fit max_seq_len 1024"):
        R.prepare_decode(model, cfg, cfg.slow.max_seq_len + 1)


def test_arena_copies_never_overlap_while_alive_and_reuse_the_front_once_gone():
    """Parameter reads land in one reused fp32 buffer; a copy still held keeps its region, a read
    that does not fit behind it gets a fresh tensor; every copy is the exact upcast."""
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(n, generator=g).to(torch.bfloat16) for n in (6, 4, 8))
    arena = R._Float32Arena(10)
    front = arena.buffer.data_ptr()
    ca = arena.copy(a)
    cb = arena.copy(b)  # a still held: b goes behind it
    assert ca.data_ptr() == front and cb.data_ptr() == front + 6 * 4
    cc = arena.copy(c)  # no room behind a and b
    assert cc.data_ptr() != front and torch.equal(cc, c.float())
    assert torch.equal(ca, a.float()) and torch.equal(cb, b.float())
    del ca, cb, cc
    again = arena.copy(c)  # everything handed out is gone: the front again
    assert again.data_ptr() == front and torch.equal(again, c.float())
