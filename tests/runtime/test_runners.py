"""The runners (anetts.runtime.runners) on a real two-function stateful package: `prefill` and
`decode` sharing a KV cache, converted from a tiny attention layer, run by the torch exports and
by the MIL executor with one state carried through the calls, against the eager module."""
from __future__ import annotations

import copy
import shutil
import sys

import numpy as np
import pytest
import torch

from kv_example import KVAttention, KVGeometry, functions, prefill_decode

from anetts.compile.convert import ConvertOptions
from anetts.compile.export import compile_module, record_eager
from anetts.options import Gate
from anetts.runtime.errors import BackendUnavailable, InputError
from anetts.runtime.runners import EXECUTORS, PackageRef, default_executor, load_program
from anetts.verify.parity import _run_backend

G = KVGeometry(dim=32, heads=2, context=16)
PREFILL, DECODE_STEPS = 4, 3
FUNCTIONS = functions(G, PREFILL)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(PackageRef of the package and its per-function TorchScript, scenario, eager reference)."""
    torch.manual_seed(0)
    model = KVAttention(G).eval()
    out = tmp_path_factory.mktemp("kv")
    package, _ = compile_module(model, FUNCTIONS.values(), out, ConvertOptions(deployment_target="macOS15", precision="fp16"),
                                {"model": "kv-tiny", "family": "test"}, "attn", geometry={"context": G.context})
    ts = out / "attn.torchscript"  # the export's layout: <function>.pt in one folder
    ts.mkdir()
    for name in FUNCTIONS:
        shutil.copy(out / f"attn.{name}.pt", ts / f"{name}.pt")
    ref = PackageRef(label="attn/ctx16", path=package, functions=tuple(FUNCTIONS.values()), function="prefill",
                     torchscript=ts)
    scenario = prefill_decode(G, PREFILL, DECODE_STEPS)
    return ref, scenario, record_eager(copy.deepcopy(model), scenario)


@pytest.mark.parametrize("executor", ["torch", "mil"])
def test_runner_plays_prefill_then_decode_with_one_state(built, executor):
    ref, scenario, reference = built
    program = load_program(executor, ref)
    assert set(program.functions) == {"prefill", "decode"} and program.executor == executor
    report = _run_backend(scenario, reference, Gate(min_snr_db=35.0), True, program)
    assert report["passed"], report
    # torch runs the fp32 exports, mil the fp16 package: both well above the gate, torch far above
    assert report["min_snr_db"] >= (80 if executor == "torch" else 35)
    # the state carries the prefill into decode: the same decode call on a fresh state differs
    decode = next(c for c in scenario.calls if c.function == "decode")
    carried = program.new_state()
    for c in scenario.calls:
        got = program.run(c.function, c.inputs, carried)
        if c is decode:
            break
    fresh = program.run("decode", decode.inputs, program.new_state("decode"))
    name = FUNCTIONS["decode"].outputs[0].name
    assert not np.allclose(got[name], fresh[name], atol=1e-3)
    states = program.read_states(carried)
    assert sorted(states) == sorted(t.name for t in FUNCTIONS["prefill"].states)
    assert all(np.abs(v).max() > 0 for v in states.values())  # written by the calls


@pytest.mark.parametrize("executor", ["torch", "mil"])
def test_a_copied_state_is_equal_and_independent(built, executor):
    ref, scenario, _ = built
    program = load_program(executor, ref)
    prefill = next(c for c in scenario.calls if c.function == "prefill")
    decode = next(c for c in scenario.calls if c.function == "decode")
    state = program.new_state()
    program.run("prefill", prefill.inputs, state)
    copied = program.copy_state(state)
    held = program.read_states(copied)
    assert copied is not state and _same(held, program.read_states(state))
    went_on = program.run("decode", decode.inputs, state)
    assert _same(program.read_states(copied), held)  # the call on the original left the copy as it was
    assert not _same(program.read_states(state), held)
    # the copy goes on exactly as the original did, and that leaves the original as it was
    after = program.read_states(state)
    from_copy = program.run("decode", decode.inputs, copied)
    assert all(np.array_equal(went_on[k], from_copy[k]) for k in went_on)
    assert _same(program.read_states(state), after) and _same(program.read_states(copied), after)
    # torch keeps states in the exports' fp32, mil in the package's fp16
    assert program.state_bytes(state) == sum(v.size for v in held.values()) * (4 if executor == "torch" else 2)
    assert program.copy_state(None) is None


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_inputs_are_checked_against_the_function(built):
    ref, scenario, _ = built
    program = load_program("mil", ref)
    call = scenario.calls[0]
    name = FUNCTIONS[call.function].inputs[0].name
    state = program.new_state()
    with pytest.raises(InputError, match=rf"attn/ctx16 function {call.function}: missing input '{name}'"):
        program.run(call.function, {k: v for k, v in call.inputs.items() if k != name}, state)
    bad = {**call.inputs, name: call.inputs[name][..., :1]}
    with pytest.raises(InputError, match=rf"function {call.function}: input {name} must be"):
        program.run(call.function, bad, state)
    with pytest.raises(InputError, match=r"unknown inputs \['speed'\]"):
        program.run(call.function, {**call.inputs, "speed": np.ones(1, np.float32)}, state)
    with pytest.raises(InputError, match="keeps states: pass state="):
        program.run(call.function, call.inputs)
    with pytest.raises(Exception, match="no function 'main'"):
        program.run("main", call.inputs, state)


def test_one_executor_list_and_one_default_rule():
    assert EXECUTORS == ("torch", "mil", "coreml", "coreai")
    if sys.platform == "darwin":
        assert default_executor() == default_executor(False) == "coreml"
    else:  # the TorchScript exports where they are the model, else the packages themselves
        assert default_executor() == "torch" and default_executor(has_torchscript=False) == "mil"
    with pytest.raises(InputError, match="unknown backend 'tpu'"):
        load_program("tpu", None)


@pytest.mark.skipif(sys.platform == "darwin", reason="Core ML runs on macOS")
def test_coreml_needs_macos(built):
    with pytest.raises(BackendUnavailable, match="needs macOS"):
        load_program("coreml", built[0])


def test_coreai_needs_an_asset(built):
    with pytest.raises(BackendUnavailable, match="runs .aimodel assets; attn/ctx16 has none"):
        load_program("coreai", built[0])


def test_torch_programs_of_a_stage_share_one_copy_of_its_weights(built):
    """Each bucket's and each function's TorchScript carries the stage's weights. Loaded through one
    pool, a second program of the stage (and the second function) points at the first one's tensors,
    its KV buffers stay its own, and it computes what an unshared copy computes."""
    from anetts.runtime.runners import SharedTensors, TorchRunner

    ref, scenario, _ = built
    shared = SharedTensors()
    a, b, alone = TorchRunner(ref, shared=shared), TorchRunner(ref, shared=shared), TorchRunner(ref)
    weights = dict(a.modules["prefill"].named_parameters())
    assert weights
    for m in (a.modules["decode"], b.modules["prefill"], b.modules["decode"]):
        assert all(t.data_ptr() == weights[n].data_ptr() for n, t in m.named_parameters())
    assert all(t.data_ptr() != weights[n].data_ptr() for n, t in alone.modules["prefill"].named_parameters())
    states = {t.name for f in FUNCTIONS.values() for t in f.states}
    kv = {n: t.data_ptr() for n, t in a.modules["prefill"].named_buffers() if n in states}
    assert kv and all(t.data_ptr() != kv[n] for n, t in b.modules["prefill"].named_buffers() if n in kv)
    sa, sb = b.new_state(), alone.new_state()
    for c in scenario.calls:
        got, want = b.run(c.function, c.inputs, sa), alone.run(c.function, c.inputs, sb)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
