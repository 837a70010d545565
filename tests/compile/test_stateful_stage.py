"""A stateful stage end to end: a causal attention layer with a KV cache (fp16 states) goes
trace -> convert (ct.StateType) -> one package with `prefill` and `decode` functions -> the MIL
executor playing a scenario (prefill 4 tokens, then 3 single-token decode steps, one state carried
through) against the eager module; a package converted from perturbed weights fails the gate."""
from __future__ import annotations

import copy
import json
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn

from kv_example import KVAttention, KVGeometry, functions, prefill_decode, states

from anetts.compile.convert import ConversionError, ConvertOptions, convert_function
from anetts.compile.export import compile_module, record_eager
from anetts.compile.inspect import function_io, load_spec
from anetts.gate import ParityError
from anetts.options import Gate
from anetts.scenario import Call, Scenario, load_scenario, save_scenario
from anetts.tensors import FunctionSpec, StateSpec, TensorSpec
from anetts.verify.parity import check_scenario, per_call_db, run_scenario

G = KVGeometry(dim=32, heads=2, context=16)
PREFILL, DECODE_STEPS = 4, 3
HEADS, HEAD_DIM = G.heads, G.head_dim
OPTIONS = ConvertOptions(deployment_target="macOS15", precision="fp16")
META = {"model": "kv-tiny", "family": "test"}
STATES = states(G)
FUNCTIONS = functions(G, PREFILL)


def make_scenario() -> Scenario:
    return prefill_decode(G, PREFILL, DECODE_STEPS)


def export_and_convert(module: nn.Module, out_dir, options: ConvertOptions = OPTIONS):
    """export (trace, checked against eager) -> convert with states -> one prefill/decode package."""
    out, reports = compile_module(module, FUNCTIONS.values(), out_dir, options, META, "attn",
                                  geometry={"context": G.context})
    for report in (reports[name] for name in FUNCTIONS):
        assert report["states"] == [{"name": s.name, "shape": list(s.shape), "dtype": "float16"} for s in STATES]
    return out


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return KVAttention(G).eval()


@pytest.fixture(scope="module")
def scenario_and_reference(model):
    scenario = make_scenario()
    return scenario, record_eager(copy.deepcopy(model), scenario)


@pytest.fixture(scope="module")
def package(model, tmp_path_factory):
    return export_and_convert(model, tmp_path_factory.mktemp("kv"))


@pytest.fixture(scope="module")
def perturbed_package(model, tmp_path_factory):
    bad = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # ~10 % relative noise on every weight: far below a 35 dB match
        for p in bad.parameters():
            p.add_(0.1 * p.std() * torch.randn(p.shape, generator=g))
    return export_and_convert(bad, tmp_path_factory.mktemp("kv_bad"))


def test_package_has_prefill_and_decode_sharing_fp16_states(package):
    spec = load_spec(package)
    io = function_io(spec)
    assert set(io) == {"prefill", "decode"}
    for name, fn in FUNCTIONS.items():
        assert [(s["name"], s["shape"], s["dtype"]) for s in io[name]["states"]] == \
            [(s.name, list(s.shape), "float16") for s in STATES]
        assert io[name]["inputs"][0]["shape"] == list(fn.inputs[0].shape)
    from anetts.mil import load_program

    program = load_program(package)
    ops = program.op_types("decode")
    assert ops["read_state"] >= 2 and ops["write_state"] == 2 and ops["slice_update"] == 2
    assert program.state_specs("prefill") == program.state_specs("decode")


def test_scenario_passes_35db_gate_per_call(package, scenario_and_reference, tmp_path):
    scenario, reference = scenario_and_reference
    report = run_scenario(package, scenario, reference, Gate(min_snr_db=35.0))
    mil = report["backends"]["mil"]
    dbs = per_call_db(report)
    print("stateful scenario, MIL vs eager, per call (worst of output y and the written cache rows):")
    for r in mil["calls"]:
        print(f"  call {r['call']} {r['function']:<7} y {r['outputs']['y']['snr_db']:.1f} dB, "
              + ", ".join(f"{k} {m['snr_db']:.1f} dB" for k, m in r["states"].items()))
    assert len(dbs) == 1 + DECODE_STEPS
    assert all(db >= 35.0 for db in dbs), dbs
    assert [r["function"] for r in mil["calls"]] == ["prefill"] + ["decode"] * DECODE_STEPS
    # the valid cache region grows with each call, and is what the states were scored on
    assert [r["states"]["k_cache"]["n"] for r in mil["calls"]] == [HEADS * HEAD_DIM * n for n in (4, 5, 6, 7)]
    assert report["passed"] is True
    if sys.platform != "darwin":  # Core ML cannot run here; the report says so instead of passing it
        assert "needs macOS" in report["backends"]["coreml"]["skipped"]
    out = tmp_path / "attn.scenario.json"
    check_scenario(report, out)
    assert json.loads(out.read_text())["backends"]["mil"]["calls"][3]["function"] == "decode"


def test_perturbed_package_fails_the_gate(perturbed_package, scenario_and_reference, tmp_path):
    scenario, reference = scenario_and_reference
    report = run_scenario(perturbed_package, scenario, reference, Gate(min_snr_db=35.0))
    dbs = per_call_db(report)
    print("perturbed weights, per call dB:", [round(d, 1) for d in dbs])
    assert report["passed"] is False and all(d < 35.0 for d in dbs)
    out = tmp_path / "attn.scenario.json"
    with pytest.raises(ParityError, match="prefill4_decode3 failed its parity gate"):
        check_scenario(report, out)
    assert not out.exists() and (tmp_path / "attn.scenario.failed.json").exists()


def test_linear_rewrite_keeps_states_and_parity(model, scenario_and_reference, tmp_path):
    """The Neural Engine's Linear -> 1x1 conv pass on a stateful program: no linear left, same gate."""
    pkg = export_and_convert(model, tmp_path, ConvertOptions(deployment_target="macOS15", linear_rewrite="conv1d"))
    from anetts.mil import load_program

    ops = load_program(pkg).op_types("decode")
    assert "linear" not in ops and ops["conv"] == 2 and ops["write_state"] == 2
    scenario, reference = scenario_and_reference
    report = run_scenario(pkg, scenario, reference, Gate(min_snr_db=35.0))
    assert report["passed"] and min(per_call_db(report)) >= 35.0


def test_decode_without_the_carried_state_fails(package, scenario_and_reference):
    """The scenario sees state bugs: a decode step run on a fresh (zero) cache is far off."""
    from anetts.mil import load_program

    scenario, reference = scenario_and_reference
    program = load_program(package)
    call = scenario.calls[1]
    fresh = program.run(dict(call.inputs), "decode", state=program.make_state("decode"))
    from anetts.metrics import compare

    assert compare(reference[1]["y"], fresh["y"])["snr_db"] < 20.0


def test_saved_scenario_scores_the_same(package, scenario_and_reference, tmp_path):
    scenario, reference = scenario_and_reference
    path = tmp_path / "attn.scenario.npz"
    save_scenario(path, scenario, reference)
    loaded, ref2 = load_scenario(path)
    assert loaded.to_json() == scenario.to_json()
    a = run_scenario(package, scenario, reference, Gate())
    b = run_scenario(package, loaded, ref2, Gate())
    assert per_call_db(a) == per_call_db(b)


def test_a_saved_state_is_what_each_call_changed_and_loads_back_exactly(scenario_and_reference, tmp_path):
    scenario, reference = scenario_and_reference
    path = tmp_path / "attn.scenario.npz"
    save_scenario(path, scenario, reference)
    _, loaded = load_scenario(path)
    with np.load(path) as z:
        kept = {k: z[k] for k in z.files if "/state/" in k}
    for i, c in enumerate(scenario.calls):
        for name, (axis, n) in c.state_valid.items():
            want = np.take(reference[i]["state/" + name], np.arange(n), axis=axis)
            np.testing.assert_array_equal(loaded[i]["state/" + name], want)
            # a prefill writes its block of rows, a decode step one row
            rows = kept[f"call{i}/eager_rows/state/{name}/index"]
            assert len(rows) == (PREFILL if c.function == "prefill" else 1)
    whole = sum(v.nbytes for ref in reference for k, v in ref.items() if k.startswith("state/"))
    assert sum(v.nbytes for v in kept.values()) < whole / 4


def test_a_loaded_scenario_saves_and_loads_back_the_same(scenario_and_reference, tmp_path):
    """What load_scenario gives (states cut to their compared region) can be saved again, e.g. with
    perturbed references, and reads back equal."""
    scenario, reference = scenario_and_reference
    save_scenario(tmp_path / "a.scenario.npz", scenario, reference)
    loaded, once = load_scenario(tmp_path / "a.scenario.npz")
    save_scenario(tmp_path / "b.scenario.npz", loaded, once)
    _, twice = load_scenario(tmp_path / "b.scenario.npz")
    assert [sorted(r) for r in once] == [sorted(r) for r in twice]
    for a, b in zip(once, twice):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_states_need_macos15_naming_the_stage(tmp_path):
    with pytest.raises(ConversionError, match=r"attn/decode: states \['k_cache', 'v_cache'\] need deployment_target macOS15"):
        convert_function(tmp_path / "never_read.pt", FUNCTIONS["decode"], tmp_path / "d.mlpackage", tmp_path / "d.json",
                         ConvertOptions(deployment_target="macOS14"), META, stage="attn")
    assert not (tmp_path / "d.mlpackage").exists() and not (tmp_path / "d.json").exists()


def test_scenario_rejects_inconsistent_calls():
    scenario = make_scenario()
    with pytest.raises(ValueError, match="unknown function 'step'"):
        Scenario("s", FUNCTIONS, (Call("step", scenario.calls[0].inputs),))
    with pytest.raises(ValueError, match="expected shape"):
        Scenario("s", FUNCTIONS, (Call("decode", scenario.calls[0].inputs),))
    with pytest.raises(ValueError, match="must be a StateSpec"):
        FunctionSpec("f", (), (), (TensorSpec("k", (1,), "float32", ""),))
    with pytest.raises(ValueError, match="input/output k_cache must be one of"):
        FunctionSpec("f", STATES[:1], ())
    with pytest.raises(ValueError, match=r"names used twice .*\['x'\]"):
        FunctionSpec("f", FUNCTIONS["decode"].inputs, (TensorSpec("x", (1,), "float32", ""),))
    with pytest.raises(ValueError, match="unsupported dtype 'float32'; choose one of \\['float16'\\]"):
        StateSpec("k", (1,), "float32", "")


def test_run_mil_cli_lists_states_and_runs_from_a_zero_state(package, scenario_and_reference, tmp_path, capsys):
    from anetts.mil.cli import main

    assert main([str(package), "--list"]) == 0
    listing = capsys.readouterr().out
    assert "state  k_cache: fp16 [1x2x16x16]" in listing and "write_state=2" in listing
    scenario, reference = scenario_and_reference
    inputs = tmp_path / "prefill.npz"
    np.savez(inputs, **scenario.calls[0].inputs)
    out = tmp_path / "out.npz"
    assert main([str(package), "-i", str(inputs), "-f", "prefill", "-o", str(out)]) == 0
    with np.load(out) as z:  # the first call of the scenario starts from zeros too
        from anetts.metrics import compare

        assert compare(reference[0]["y"], z["y"])["snr_db"] >= 35.0
