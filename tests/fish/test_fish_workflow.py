"""Fish in the DAG: `snakemake all --config model=fish-tiny` builds gated, manifested packages
(scenario stages: multifunction packages with fp16 KV states, parity by teacher-forced scenarios
against upstream, the compiled chain gated; the bucketed codec with its bundle), and the config
expands repeated stages per model."""
from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest
import yaml

from anetts.workflow import ConfigError, WorkflowConfig
from fish_helpers import fish_config
from workflow_helpers import REPO, make_workflow_copy, run_snakemake

MODEL = "fish-tiny"


def test_config_expands_repeated_stages_per_model():
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    wf = WorkflowConfig(cfg)
    assert wf.stages("fish-tiny") == ["slow_chunk0", "slow_chunk1", "fast_ar", "codec"]
    # the model's own stage settings override its family's: fish-s2-pro sets more chunks, fish-tiny one codec bucket
    assert wf.stages("fish-s2-pro")[:-2] == [f"slow_chunk{k}" for k in range(cfg["models"]["fish-s2-pro"]["stages"]["slow_chunk"]["chunks"])]
    assert wf.buckets("fish-tiny", "codec") == ["f8"] and wf.buckets("fish-s2-pro", "codec") == ["f16", "f64"]
    assert wf.stage_params("fish-tiny", "slow_chunk1")["index"] == 1
    # the AR stages' packages already hold their functions; the codec's buckets are bundled
    assert wf.bundled_stages("fish-tiny") == ["codec"] and "duration" in wf.bundled_stages("kokoro-tiny")
    assert wf.stage_params("fish-tiny", "fast_ar")["scenario_frames"] == wf.reference_params("fish-tiny")["scenario_frames"]
    assert "scenario_frames" not in wf.stage_params("fish-tiny", "codec")
    assert wf.bundles("fish-tiny") == ["artifacts/fish-tiny/bundles/codec.mlpackage"]
    assert wf.chain_reports("fish-tiny") == ["artifacts/fish-tiny/chain/ctx320.json"]  # the codec is not in a chain
    assert wf.chain_reports("kokoro-tiny") == []
    # the model's own chain settings (fish-s2-pro compares fewer fused frames: each is ~5 s at full size)
    assert wf.chain_settings("fish-tiny") == {}
    assert wf.chain_settings("fish-s2-pro") == cfg["models"]["fish-s2-pro"]["chain"]


def test_the_chain_counts_a_flip_as_a_pick_only_when_it_is_a_near_tie_of_close_logits():
    from types import SimpleNamespace

    from anetts.models.fish.chain_check import NEAR_TIE_NOISE, picks_or_ties

    def flip(codebook, in_noise, db):
        return {"codebook": codebook, "gap_in_noise": in_noise, "logits_db": db}

    run = {"frames": 10, "divergences": [
        flip(0, 1.0, 45.0),                   # a near-tie: counts as agreement
        flip(3, NEAR_TIE_NOISE * 1.01, 45.0),  # too far for the noise
        flip(4, 0.5, 20.0),                   # close, but the logits are far from upstream's
        flip(5, None, 45.0),                  # a flip with no noise at all
    ]}
    r = picks_or_ties(run, SimpleNamespace(num_codebooks=10), min_logits_db=35.0)
    assert r == {"head": 1.0, "fast": 1 - 3 / 90, "ties": 1, "not_ties": 3}


def test_unknown_chain_settings_are_named():
    from anetts.families import get_family

    with pytest.raises(ValueError, match=r"unknown settings \['frames'\]; known: fused_frames"):
        get_family("fish").check_chain({}, None, None, None, {}, {"frames": 3})


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["families"]["fish"]["stages"]["slow_chunk"].pop("chunks"), "needs `chunks`"),
    (lambda c: c["families"]["fish"].pop("scenario_frames"), "families.fish.scenario_frames"),
    (lambda c: c["models"]["fish-tiny"].update(stages={"slow_chunks": {"chunks": 2}}), "models.fish-tiny.stages.slow_chunks"),
])
def test_bad_fish_config_names_the_key(edit, message):
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    edit(cfg)
    with pytest.raises(ConfigError, match=re.escape(message)):
        WorkflowConfig(cfg)


def test_a_chunk_count_whose_files_are_too_large_is_refused_before_anything_runs(tmp_path):
    """fish-s2-pro in 2 chunks puts 18 layers (3.6 GB at fp16) in one file, over macOS's ~2 GB:
    `snakemake all` stops while reading the config, naming the key, the size and the count that
    fits, and writes nothing."""
    cfg = fish_config()
    cfg["model"] = "fish-s2-pro"
    cfg["models"]["fish-s2-pro"]["stages"]["slow_chunk"]["chunks"] = 2
    workdir = make_workflow_copy(tmp_path / "wf", cfg)
    proc = run_snakemake(workdir, "all", check=False)
    assert proc.returncode != 0
    assert ("models.fish-s2-pro.stages.slow_chunk.chunks = 2: slow_chunk0's package would hold 3634 MB of "
            "weights, above max_package_mb = 2048; set it to at least 4") in proc.stderr
    assert not (workdir / "artifacts").exists()
    # iOS's ~1 GB per file, set on the family: the shipped 9 chunks are the fewest that fit
    cfg["families"]["fish"]["stages"]["slow_chunk"]["max_package_mb"] = 1000
    with pytest.raises(ConfigError, match=re.escape("above max_package_mb = 1000; set it to at least 9")):
        WorkflowConfig(cfg)
    cfg["models"]["fish-s2-pro"]["stages"]["slow_chunk"]["chunks"] = 9
    WorkflowConfig(cfg)
    cfg["models"]["fish-s2-pro"]["stages"]["slow_chunk"]["chunks"] = 37
    with pytest.raises(ConfigError, match=re.escape("stages.slow_chunk.chunks = 37: 37 chunks for 36 layers")):
        WorkflowConfig(cfg)


def test_the_file_sizes_counted_before_converting_are_the_built_ones(fish_build):
    """What the config check counts per package equals the weight file each package was built with
    (to within the file's per-tensor headers and the RoPE tables, which it does not count)."""
    wf = WorkflowConfig(yaml.safe_load((fish_build / "config.yaml").read_text()), root=fish_build)
    counted = wf.file_bytes(MODEL)
    assert set(counted) == {"slow_chunk0", "slow_chunk1", "fast_ar"}
    for stage, n in counted.items():
        weight_file = fish_build / wf.package(MODEL, stage, "ctx256") / "Data/com.apple.CoreML/weights/weight.bin"
        assert n <= weight_file.stat().st_size <= 1.03 * n, (stage, n, weight_file.stat().st_size)


@pytest.mark.parametrize("model, chunks, codec_buckets", [("fish-tiny", 2, 1), ("fish-s2-pro", 9, 2)])
def test_dry_run_lists_every_fish_job(tmp_path, model, chunks, codec_buckets):
    cfg = fish_config()
    cfg["model"] = model
    workdir = make_workflow_copy(tmp_path / "wf", cfg)
    out = run_snakemake(workdir, "-n", "all").stdout
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", out, re.M))
    n = chunks + 1  # the slow chunks (the last holds the head) and the fast AR
    # one rule per step for every stage kind, the export included (one layout)
    assert {k: int(counts[k]) for k in ("export", "convert", "parity", "chain_parity")} == \
        {"export": n + codec_buckets, "convert": n + codec_buckets, "parity": n + codec_buckets, "chain_parity": 1}
    assert "export_scenario" not in counts
    assert {k: int(counts[k]) for k in ("bundle", "bundle_parity")} == {"bundle": 1, "bundle_parity": 1}


def test_fish_build_is_gated_and_manifested(fish_build):
    mdir = fish_build / "artifacts" / MODEL
    m = json.loads((mdir / "manifest.json").read_text())
    assert m["family"] == "fish" and "Fish Audio Research License" in m["licence"]
    assert [(p["stage"], p["bucket"]) for p in m["packages"]] == [
        ("slow_chunk0", "ctx256"), ("slow_chunk1", "ctx256"), ("fast_ar", "ctx256"), ("codec", "f8")]
    for p in m["packages"]:
        assert p["parity"]["passed"]
        assert (mdir / p["path"]).is_dir() and (mdir / p["scenario"]).is_file()
        # one export layout for every stage: a folder of <function>.pt
        assert sorted(f.name for f in (mdir / p["torchscript"]).glob("*.pt")) == sorted(
            f"{f['name']}.pt" for f in p["functions"])
    codec = m["packages"][-1]
    # the contract the runtime codes against: typed functions, exports as functions folders (manifest v4)
    assert m["manifest_version"] == 4 and codec["function"] == "main" and len(codec["functions"]) == 1
    main = codec["functions"][0]
    assert [(t["name"], t["shape"], t["dtype"]) for t in main["inputs"]] == [("codes", [1, 10, 8], "int32")]
    assert [(t["name"], t["shape"], t["dtype"]) for t in main["outputs"]] == [("audio", [1, 8 * 2048], "float32")]
    assert main["states"] == [] and codec["geometry"]["samples_per_frame"] == 2048 and codec["precision"] == "fp16"
    chunk = m["packages"][0]
    functions = {f["name"]: f for f in chunk["functions"]}
    assert set(functions) == {"prefill", "decode"} and chunk["function"] == "prefill"
    states = functions["decode"]["states"]
    assert states == functions["prefill"]["states"]  # one KV state shared by both functions
    assert states and all(s["dtype"] == "float16" and s["shape"][2] == 256 for s in states)
    assert m["chain"] and all(c["passed"] for c in m["chain"])
    assert {a["name"] for a in m["assets"]} >= {"tokenizer.json", "config.json", "embeddings.fp16.npy"}
    assert [(b["stage"], b["buckets"], [f["name"] for f in b["functions"]], b["parity"]["passed"])
            for b in m["bundles"]] == [("codec", {"f8": "f8"}, ["f8"], True)]


def test_fish_parity_checks_every_position_against_upstream(fish_build):
    par = fish_build / "artifacts" / MODEL / "parity"
    chunk = json.loads((par / "slow_chunk1" / "ctx256.json").read_text())
    mil = chunk["backends"]["mil"]
    assert chunk["calls_per_function"]["decode"] >= 64  # decode steps at positions well past 0
    lo, hi = chunk["positions_checked"]
    assert lo == 0 and hi >= 149 + 64
    assert all(c["passed"] and c["min_snr_db"] >= 35 for c in mil["calls"])
    assert mil["calls"][-1]["states_min_snr_db"] >= 35  # the KV rows written so far, compared too
    # the last chunk's head: top-1 over every valid row (the prompt's and each frame's)
    assert mil["top1"]["logits"]["agreement"] >= 0.99 and mil["top1"]["logits"]["positions"] == hi + 1
    assert "logits" not in json.loads((par / "slow_chunk0" / "ctx256.json").read_text())["backends"]["mil"]["top1"]
    fast = json.loads((par / "fast_ar" / "ctx256.json").read_text())
    assert fast["calls"] >= 64 * 10 and fast["backends"]["mil"]["top1"]["logits"]["agreement"] >= 0.99
    chain = json.loads((fish_build / "artifacts" / MODEL / "chain" / "ctx256.json").read_text())
    tf = chain["teacher_forced"]
    assert tf["frames"] >= 64 and tf["head_top1"] >= 0.99 and tf["fast_codes_agreement"] >= 0.99
    assert chain["closed_loop"]["frames"] == tf["frames"]
    assert chain["calls_per_frame"] == {"frame": 2 + 1, "decode": 2 + 10}  # 2 slow chunks, then the fast AR
    ties = tf["picks_or_ties"]  # near-ties forgiven: never below the raw agreement
    assert ties["head"] >= tf["head_top1"] and ties["fast"] >= tf["fast_codes_agreement"] - 1e-9
    assert ties["ties"] + ties["not_ties"] == len(tf["divergences"])
    from anetts.models.fish.chain_check import FUSED_FRAMES

    for mode, fused in chain["fused_vs_stepped"].items():  # the fast AR's frame vs decode, 128 frames each
        assert fused["passed"] and fused["frames"] == FUSED_FRAMES >= 128, mode
        assert all(d["stepped_gap"] <= d["tie_bound"] == pytest.approx(chain["fused_tie"]["draw_gap"] +
                                                                        chain["fused_tie"]["noise_units"] * d["noise"])
                   for d in fused["divergences"])


def test_package_metadata_carries_the_licence(fish_build):
    from anetts.mil import load_program  # noqa: F401 - the package must also load for the executor
    from coremltools.models.utils import load_spec

    spec = load_spec(str(fish_build / "artifacts" / MODEL / "packages" / "fast_ar" / "ctx256.mlpackage"))
    assert "Fish Audio Research License" in spec.description.metadata.license
    assert "Built with Fish Audio" in spec.description.metadata.license
    assert spec.description.metadata.userDefined["anetts.family"] == "fish"


def test_a_wrong_package_fails_its_scenario_and_leaves_no_report(fish_build, tmp_path):
    """Upstream's expected outputs perturbed (as a package from other weights would score): the gate fails."""
    from anetts.gate import ParityError
    from anetts.options import Gate
    from anetts.scenario import load_scenario, save_scenario
    from anetts.verify.parity import check_parity, run_parity

    exp = fish_build / "artifacts" / MODEL / "export" / "fast_ar"
    scenario, expected = load_scenario(exp / "ctx256.scenario.npz")
    g = np.random.default_rng(0)
    wrong = [{k: (v + 0.2 * np.std(v) * g.standard_normal(v.shape).astype(v.dtype) if k == "logits" else v)
              for k, v in e.items()} for e in expected]
    save_scenario(tmp_path / "wrong.scenario.npz", scenario, wrong)
    report = run_parity(fish_build / "artifacts" / MODEL / "packages" / "fast_ar" / "ctx256.mlpackage",
                        tmp_path / "wrong.scenario.npz", exp / "ctx256.export.json", Gate.make())
    assert not report["passed"]
    with pytest.raises(ParityError, match=r"fast_ar/ctx256 failed its parity gate \(min \S+ dB, .*top-1 >= "):
        check_parity(report, tmp_path / "r.json", tmp_path / "r.npz")
    assert not (tmp_path / "r.json").exists() and (tmp_path / "r.failed.json").exists()


def test_noop_rebuild_has_nothing_to_do(fish_build):
    out = run_snakemake(fish_build, "-n", "all").stdout
    assert "Nothing to be done" in out


def test_size_lint_fails_an_oversized_package(fish_build, tmp_path):
    """max_package_mb below a chunk's size: conversion fails naming the key and leaves no package."""
    from anetts.compile.convert import ConversionError, ConvertOptions, convert_export

    exp = fish_build / "artifacts" / MODEL / "export" / "slow_chunk1"
    out = tmp_path / "slow_chunk1.mlpackage"
    opts = ConvertOptions.make(deployment_target="macOS15", max_package_mb=0.1)
    with pytest.raises(ConversionError, match="max_package_mb"):
        convert_export(exp / "ctx256.functions", exp / "ctx256.export.json", out, tmp_path / "r.json",
                       opts, {"model": MODEL, "family": "fish"})
    assert not out.exists() and not (tmp_path / "r.json").exists()


def test_the_runtime_loads_a_fish_build(fish_build):
    """The family declares its runtime: anetts.load opens the build with the Fish runtime and its own runner."""
    import anetts
    from anetts.models.fish.runtime import FishRuntime
    from anetts.runtime import BackendUnavailable

    tts = anetts.load(fish_build / "artifacts" / MODEL, backend="mil")
    assert isinstance(tts, FishRuntime) and tts.backend.name == "mil" and tts.context == 256
    if sys.platform != "darwin":
        with pytest.raises(BackendUnavailable, match="needs macOS"):
            anetts.load(fish_build / "artifacts" / MODEL, backend="coreml")
