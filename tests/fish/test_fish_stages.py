"""Fish AR stages on fish-tiny: each eager wrapper equals the upstream reference at every position
of a reference decode (prefill of the 149-token prompt, then 15 decode steps); each compiled
package (fp16, macOS15, states) passes a 35 dB gate at every call of a teacher-forced scenario on
the MIL executor, and its perturbed-weights twin fails; the runtime's decode loop over the
compiled chain slow chunks (the last with the restricted head) -> fast_ar reproduces the reference's
greedy codes."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from anetts.compile.export import compile_module as export_stage
from anetts.compile.export import record_eager
from anetts.models.fish.chain_check import play_mil
from anetts.models.fish.stages.fast_ar import FastARStage
from anetts.models.fish.stages.lm_head import restricted_ids
from anetts.models.fish.config import chunk_bounds
from anetts.models.fish.stages.slow_chunk import SlowChunkStage
from anetts.metrics import logit_rows, top1_agreement
from anetts.options import ConvertOptions, Gate
from anetts.verify.parity import per_call_db, run_scenario
from anetts.workflow import WorkflowConfig
from fish_helpers import MODEL, REPO, fish_config

PREFILL, CONTEXT = 16, 192  # 164-token prompt padded to 176, plus 15 decode positions
CHAIN_FRAMES = 8
SCENARIO_DECODE, SCENARIO_FRAMES = 6, 3  # per-stage scenarios in the test; the chain runs 8 frames
OPTIONS = ConvertOptions(deployment_target="macOS15", precision="fp16")
# the fast AR as config.yaml converts it (its in-graph sampler fp32)
FAST_OPTIONS = ConvertOptions(**WorkflowConfig(fish_config(), root=REPO).convert_options(MODEL, "fast_ar"))
META = {"model": "fish-tiny", "family": "fish"}
GATE = Gate(min_snr_db=35.0)


def slow_io(ref: dict, model, a: int, b: int, n_layer: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference residual stream entering layer a and leaving layer b-1 (final-normed after the
    last layer) at every position 0..T+F-2 of the reference decode."""
    hin = np.concatenate([ref["prefill_layer_hidden"][a], ref["decode_layer_hidden"][:, a]])
    if b < n_layer:
        return hin, np.concatenate([ref["prefill_layer_hidden"][b], ref["decode_layer_hidden"][:, b]])
    with torch.no_grad():
        normed = model.norm(torch.from_numpy(ref["prefill_layer_hidden"][b])).numpy()
    return hin, np.concatenate([normed, ref["slow_hidden"][1:]])


def perturbed(module: torch.nn.Module) -> torch.nn.Module:
    bad = copy.deepcopy(module)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # ~10 % relative noise on every weight: far below a 35 dB match
        for p in bad.parameters():
            p.add_(0.1 * p.std() * torch.randn(p.shape, generator=g))
    return bad


@pytest.fixture(scope="module")
def setup(fish_tiny, fish_reference):
    model, cfg, prompt, ref = fish_reference
    chunks = [SlowChunkStage(cfg, k, 2, PREFILL) for k in range(2)]
    fast = FastARStage(cfg)
    modules = {st.name: st.build(st.load(fish_tiny, CONTEXT)) for st in [*chunks, fast]}
    return model, cfg, prompt, ref, chunks, fast, modules


@pytest.fixture(scope="module")
def packages(setup, tmp_path_factory):
    _, cfg, _, _, chunks, fast, modules = setup
    out = tmp_path_factory.mktemp("fish_stages")
    pkgs = {}
    for st in chunks:
        pkgs[st.name] = export_stage(modules[st.name], st.functions(CONTEXT), out, OPTIONS, META, st.name)[0]
    pkgs["fast_ar"] = export_stage(modules["fast_ar"], fast.functions(), out, FAST_OPTIONS, META, "fast_ar")[0]
    return pkgs


def test_slow_chunks_eager_equal_reference_at_every_position(setup):
    model, cfg, prompt, ref, chunks, *_, modules = setup
    T = prompt.shape[1]
    for st in chunks:
        hin, hout = slow_io(ref, model, st.start, st.stop, cfg.slow.n_layer)
        sc = st.teacher_forced(hin, T, CONTEXT)
        rec = record_eager(modules[st.name], sc)
        got = np.concatenate([r["hidden_out"][0, :c.valid.get("hidden_out", (1, 1))[1]] for r, c in zip(rec, sc.calls)])
        assert got.shape == hout.shape == (T + len(ref["decode_layer_hidden"]), cfg.slow.dim)
        err = np.abs(got - hout).max(axis=1) / np.abs(hout).max()
        assert err.max() < 1e-5, (st.name, int(err.argmax()), float(err.max()))


def test_last_chunk_head_gives_upstream_logits_at_the_sampled_rows(setup):
    """The last chunk's `logits` are upstream's at the restricted rows at every position: every
    prompt position (upstream's `return_all` prefill) and every frame's slow step."""
    model, cfg, prompt, ref, chunks, _, modules = setup
    last, T = chunks[-1], prompt.shape[1]
    hin, _ = slow_io(ref, model, last.start, last.stop, cfg.slow.n_layer)
    sc = last.teacher_forced(hin, T, CONTEXT)
    got = np.concatenate([r["logits"][0, :c.valid.get("logits", (1, 1))[1]] for r, c in zip(record_eager(modules[last.name], sc), sc.calls)])
    ids = restricted_ids(cfg)
    assert len(ids) == cfg.n_semantic + 1 and ids[-1] == cfg.im_end_id
    np.testing.assert_allclose(got[:T], ref["prefill_head_logits"], atol=1e-5)
    np.testing.assert_allclose(got[T - 1:], ref["slow_logits"][:, ids], atol=1e-5)  # frame 0: the prompt's last row
    assert list(ids[got[T - 1:].argmax(-1)]) == list(ref["semantic_tokens"])
    assert [o.name for o in last.functions(CONTEXT)[0].outputs] == ["hidden_out", "logits"]
    assert not any(o.name == "logits" for o in chunks[0].functions(CONTEXT)[0].outputs)
    # upstream's biased argmax over the full head equals the restricted argmax for any state,
    # including ones where a text token has the largest logit overall
    from anetts.models.fish.reference import semantic_bias

    g = torch.Generator().manual_seed(3)
    w = modules[last.name].head_weight
    full = torch.randn(64, cfg.slow.vocab_size, generator=g) * 3
    full[:, :cfg.semantic_begin_id] += 5.0  # text tokens win the unbiased argmax
    assert not np.isin(torch.argmax(full, dim=-1).numpy(), ids).any()
    picks_full = torch.argmax(full + semantic_bias(cfg), dim=-1).numpy()
    assert [int(ids[i]) for i in torch.argmax(full[:, ids], dim=-1)] == list(picks_full)
    assert w.shape == (len(ids), cfg.slow.dim) and last.uncompressed_weights() == ("head_weight",)
    assert chunks[0].uncompressed_weights() == ()


def test_fast_ar_eager_equals_reference_every_frame_without_a_reset(setup):
    _, cfg, _, ref, _, fast, modules = setup
    sc = fast.teacher_forced(ref["slow_hidden"], ref["codes"])
    rec = record_eager(modules["fast_ar"], sc)
    stepped = np.stack([r["logits"].reshape(-1) for r in rec if "logits" in r]).reshape(ref["fast_logits"].shape)
    fused = np.concatenate([r["frame_logits"] for r in rec if "frame_logits" in r])
    for got in (stepped, fused):  # one fused call per frame, then its 10 stepped calls
        assert np.abs(got - ref["fast_logits"]).max() < 1e-5 * np.abs(ref["fast_logits"]).max() * 10
        assert (got[:, 1:].argmax(-1) == ref["codes"][:, 1:]).all()
    # the fused call drew upstream's codes from their noise (`forced_draw`)
    assert (np.concatenate([r["codes"] for r in rec if "codes" in r]) == ref["codes"][:, 1:]).all()
    # every fast-AR tensor of the checkpoint (but the slow input's codebook table) is a parameter
    from anetts.models.fish.stages.fast_ar import fast_tensor_names
    from anetts.models.fish.weights import FAST_PREFIX, checkpoint_spec

    expected = {n for n in checkpoint_spec(cfg) if n.startswith(FAST_PREFIX) and "codebook_embeddings" not in n}
    assert set(fast_tensor_names(cfg)) == expected
    assert len(list(modules["fast_ar"].parameters())) == len(expected)


def test_compiled_stages_pass_the_gate_at_every_call(setup, packages):
    model, cfg, prompt, ref, chunks, fast, modules = setup
    T = prompt.shape[1]
    last = chunks[-1]
    hin, _ = slow_io(ref, model, last.start, last.stop, cfg.slow.n_layer)
    sc = last.teacher_forced(hin[:T + SCENARIO_DECODE], T, CONTEXT)  # the full 15 steps: benchmarks/fish_stages.py
    rec = record_eager(copy.deepcopy(modules[last.name]), sc)
    report = run_scenario(packages[last.name], sc, rec, GATE)
    dbs = per_call_db(report)
    # the head's picks at the frames' slow steps: the prompt's last row, then every decode call
    played = play_mil(packages[last.name], sc)
    row = (T - 1) % PREFILL
    want = logit_rows([rec[-(-T // PREFILL) - 1]["logits"][0, row], *(r["logits"] for r in rec[-SCENARIO_DECODE:])])
    got = logit_rows([played[-(-T // PREFILL) - 1]["logits"][0, row], *(o["logits"] for o in played[-SCENARIO_DECODE:])])
    top1 = top1_agreement(want, got)
    print(f"{last.name}: {len(dbs)} calls, dB per call {[round(d, 1) for d in dbs]}, head top-1 {top1}")
    assert report["passed"] and len(dbs) == -(-T // PREFILL) + SCENARIO_DECODE and min(dbs) >= 35.0
    assert {"hidden_out", "logits"} <= set(played[-1]) and top1 == 1.0

    sc = fast.teacher_forced(ref["slow_hidden"][:SCENARIO_FRAMES], ref["codes"][:SCENARIO_FRAMES])
    rec = record_eager(copy.deepcopy(modules["fast_ar"]), sc)
    report = run_scenario(packages["fast_ar"], sc, rec, GATE)
    dbs = per_call_db(report)
    played = play_mil(packages["fast_ar"], sc)
    top1 = {out: top1_agreement(logit_rows(r[out] for r in rec if out in r), logit_rows(o[out] for o in played if out in o))
            for out in fast.logits_outputs()}
    print(f"fast_ar: {len(dbs)} calls, min {min(dbs):.1f} dB, top-1 {top1}")
    assert report["passed"] and len(dbs) == SCENARIO_FRAMES * (cfg.num_codebooks + 1)
    assert top1 == {"frame_logits": 1.0, "logits": 1.0}


def test_perturbed_and_half_split_rope_twins_fail_the_gate(fish_tiny, setup, tmp_path):
    model, cfg, prompt, ref, chunks, fast, modules = setup
    last = chunks[-1]
    hin, _ = slow_io(ref, model, last.start, last.stop, cfg.slow.n_layer)
    sc = last.teacher_forced(hin[:4], 0, CONTEXT)  # decode-only, positions 0..3
    decode = [f for f in last.functions(CONTEXT) if f.name == "decode"]
    pkg = export_stage(perturbed(modules[last.name]), decode, tmp_path, OPTIONS, META, last.name)[0]
    dbs = per_call_db(run_scenario(pkg, sc, record_eager(copy.deepcopy(modules[last.name]), sc), GATE))
    print(f"perturbed {last.name}: {[round(d, 1) for d in dbs]}")
    assert all(d < 35.0 for d in dbs)

    # a half-split RoPE twin (NeoX rotate_half on the unpermuted weights) passes at position 0,
    # where RoPE is the identity (all an earlier port ever checked), and fails at every later one
    half = SlowChunkStage(cfg, 1, 2, PREFILL, rope="half_split")
    pkg = export_stage(half.build(half.load(fish_tiny, CONTEXT)), decode,
                       tmp_path / "half", OPTIONS, META, last.name)[0]
    dbs = per_call_db(run_scenario(pkg, sc, record_eager(copy.deepcopy(modules[last.name]), sc), GATE))
    print(f"half-split RoPE {last.name}, decode at positions 0..3: {[round(d, 1) for d in dbs]}")
    assert dbs[0] >= 35.0 and all(d < 35.0 for d in dbs[1:])

    sc = fast.teacher_forced(ref["slow_hidden"][:1], ref["codes"][:1])
    pkg = export_stage(perturbed(modules["fast_ar"]), fast.functions(), tmp_path, FAST_OPTIONS, META, "fast_ar")[0]
    dbs = per_call_db(run_scenario(pkg, sc, record_eager(copy.deepcopy(modules["fast_ar"]), sc), GATE))
    print(f"perturbed fast_ar: {[round(d, 1) for d in dbs]}")
    assert all(d < 35.0 for d in dbs)


def test_runtime_loop_over_the_compiled_chain_reproduces_the_reference_codes(fish_tiny, setup, packages, tmp_path):
    """The runtime's decode loop (`FishDecoder`, its fp16 input embedding) over these packages, greedy
    and closed loop, as the chain check and the runtime run it."""
    from anetts.models.fish.assets import InputEmbedding, write_runtime_assets
    from anetts.models.fish.chain_check import compiled_decoder, decode_against

    _, cfg, prompt, ref, chunks, *_ = setup
    write_runtime_assets(fish_tiny, tmp_path)
    embed = InputEmbedding.from_dir(tmp_path)
    want = ref["prefill_layer_hidden"][0]
    assert np.abs(embed(prompt) - want).max() <= 2 ** -10 * np.abs(want).max()  # fp16 tables
    composed = {f"slow_chunk{i}": packages[st.name] for i, st in enumerate(chunks)}
    decoder = compiled_decoder(composed, packages["fast_ar"], embed, PREFILL)
    s = decode_against(decoder, ref, CHAIN_FRAMES, follow=False)
    print("chain:", {k: v for k, v in s.items() if k != "divergences"})
    assert s["positions"] == list(range(prompt.shape[1] - 1, prompt.shape[1] - 1 + CHAIN_FRAMES))
    assert s["frames_all_codes_equal"] == CHAIN_FRAMES and s["semantic_equal"] == CHAIN_FRAMES
    assert min(s["slow_hidden_db"]) >= 35.0 and s["head_top1"] == 1.0 and s["fast_top1"] == 1.0


def test_stage_arguments_are_checked(setup):
    _, cfg, *_ = setup
    with pytest.raises(ValueError, match=r"slow_chunk3: only 2 chunks are configured"):
        SlowChunkStage(cfg, 3, 2)
    st = SlowChunkStage(cfg, 0, 2, PREFILL)
    with pytest.raises(ValueError, match="context 8 is shorter than the prefill block 16"):
        st.functions(8)
    with pytest.raises(ValueError, match="do not fit a context of 32"):
        st.teacher_forced(np.zeros((40, cfg.slow.dim)), 16, 32)
    assert chunk_bounds(36, 4) == [(0, 9), (9, 18), (18, 27), (27, 36)] and chunk_bounds(5, 2) == [(0, 3), (3, 5)]
    assert [s.name for s in st.states(CONTEXT)] == ["k_cache_0", "v_cache_0", "k_cache_1", "v_cache_1"]
    assert st.states(CONTEXT)[0].shape == (1, cfg.slow.n_local_heads, CONTEXT, cfg.slow.head_dim)
    from anetts.models.fish.config import FishConfig
    from anetts.models.fish.presets import preset

    from anetts.models.fish.frame_cost import head_bytes

    s2 = FishConfig.from_dict(preset("fish-s2-pro").config)
    assert (len(restricted_ids(s2)), s2.slow.vocab_size) == (4097, 155776)  # 4096 semantic ids + <|im_end|>
    assert head_bytes(s2) == 4097 * 2560 * 2  # of the full head's 155,776 rows


def test_layer_norm_rms_lowering_is_the_same_norm(fish_tiny, setup):
    """RMSNorm as LayerNorm(concat(x, -x)) (the fp16-safe lowering) equals the decomposed one."""
    from anetts.models.fish.stages.layers import rms_norm

    model, cfg, prompt, ref, chunks, *_ = setup
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(0)) * 40
    w = torch.rand(64) + 0.5
    torch.testing.assert_close(rms_norm(x, w, 1e-6, "layer_norm"), rms_norm(x, w, 1e-6), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="unknown RMSNorm lowering 'fused'"):
        rms_norm(x, w, 1e-6, "fused")
    st = SlowChunkStage(cfg, len(chunks) - 1, len(chunks), PREFILL, lowering="layer_norm")
    hin, hout = slow_io(ref, model, st.start, st.stop, cfg.slow.n_layer)
    sc = st.teacher_forced(hin[:prompt.shape[1] + 2], prompt.shape[1], CONTEXT)
    rec = record_eager(st.build(st.load(fish_tiny, CONTEXT)), sc)
    np.testing.assert_allclose(rec[-1]["hidden_out"][0, 0], hout[prompt.shape[1] + 1], atol=1e-4)


def test_top1_agreement_counts_argmax_matches():
    ref = np.array([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.5, 0.0]])
    got = np.array([[0.0, 1.9, 1.0], [0.0, 3.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.9, 0.0]])
    assert top1_agreement(ref, got) == 0.75 and top1_agreement(ref, ref) == 1.0
    with pytest.raises(ValueError, match="shape mismatch"):
        top1_agreement(ref, got[:2])
