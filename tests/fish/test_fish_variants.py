"""Compressed Fish variants: the multifunction stateful packages compressed with their functions still
sharing one copy of the weights, gated on the scenario (per call and top-1), the compiled chain gated
again on the variant's packages, and the weight bytes per frame counted and projected."""
from __future__ import annotations

import json
import shutil

import pytest
import yaml

from fish_helpers import MODEL, fish_config
from workflow_helpers import REPO, run_snakemake

AR = ["slow_chunk", "fast_ar"]
# int8 per channel on every AR stage; the gathers (RoPE tables, the fast AR's code embedding) stay
# fp16, and so does the last chunk's head (the stage keeps it uncompressed)
INT8 = {"mode": "linear", "dtype": "int8", "granularity": "per_channel", "stages": AR,
        "exclude_op_types": ["gather"], "gate": {"min_snr_db": 20, "min_top1": 0.9}}
# two LUT entries per fast-AR weight: far too coarse for its codes
LUT1 = {"mode": "palettize", "nbits": 1, "stages": ["fast_ar"], "gate": {"min_snr_db": 0, "min_top1": 0.9}}


def _vc(variants: dict):
    from anetts.variants import VariantConfig
    from anetts.workflow import WorkflowConfig

    cfg = fish_config()
    cfg["variants"] = variants
    return VariantConfig(cfg, WorkflowConfig(cfg, root=REPO))


def test_a_repeated_stage_is_named_by_its_declared_name():
    vc = _vc({"v": {"mode": "palettize", "nbits": 4, "granularity": "per_grouped_channel", "stages": AR,
                    "overrides": {"slow_chunk": {"nbits": 6}, "slow_chunk1": {"nbits": 8}, "fast_ar": {"mode": "linear"}}}})
    assert vc.stages(MODEL, "v") == ["slow_chunk0", "slow_chunk1", "fast_ar"]
    # an instance's own name before its declared name
    assert [vc.settings(MODEL, "v", s)["nbits"] for s in ("slow_chunk0", "slow_chunk1")] == [6, 8]
    fast = vc.settings(MODEL, "v", "fast_ar")  # another mode: that mode's defaults, not the LUT's keys
    assert fast["mode"] == "linear" and "nbits" not in fast and fast["granularity"] == "per_channel"
    # the chain is composed of the variant's packages where it compresses, else the base ones
    pkgs = vc.chain_packages(MODEL, "v", "ctx256")
    assert all("/variants/v/" in p for p in pkgs)
    assert vc.chain_reports(MODEL, "v") == [f"artifacts/{MODEL}/variants/v/chain/ctx256.json"]
    codec_only = _vc({"c": {"mode": "linear", "stages": ["codec"]}})
    assert codec_only.chain_reports(MODEL, "c") == []  # the codec is not part of the AR chain


def test_group_size_that_divides_no_channel_count_is_refused(fish_build):
    """The head has 513 rows (512 semantic ids + <|im_end|>): coremltools would skip it silently. The
    stage keeps it uncompressed (`uncompressed_weights`), and then every other weight divides."""
    from anetts.compile.compress import CompressionError, compress_model, resolve_settings
    from anetts.compile.spec_walk import program_ops

    pkg = fish_build / "artifacts" / MODEL / "packages" / "slow_chunk1" / "ctx256.mlpackage"
    settings = resolve_settings({"mode": "palettize", "nbits": 4, "granularity": "per_grouped_channel",
                                 "group_size": 16}, "variants.v")
    with pytest.raises(CompressionError, match=r"variants\.v\.group_size: 16 does not divide"):
        compress_model(pkg, settings, "variants.v")
    out, gained, kept = compress_model(pkg, settings, "variants.v", ("head_weight",))
    [const] = kept["head_weight"]
    assert const.startswith("head_weight_conv_") and gained["constexpr_lut_to_dense"] > 0
    ops = {o.name: op.type for _, op in program_ops(out.get_spec()) for o in op.outputs}
    assert ops[const] == "const"  # still the fp16 weight, not a constexpr
    with pytest.raises(CompressionError, match=r"keeps weights \['norm_weight_x'\] uncompressed"):
        compress_model(pkg, settings, "variants.v", ("norm_weight_x",))


def test_frame_bytes_model_counts_what_coremltools_stores():
    from anetts.compile.compress import resolve_settings
    from anetts.models.fish.frame_cost import frame_bytes, projection, tensor_bytes
    from anetts.models.fish.presets import preset
    from anetts.models.fish.config import FishConfig

    lut4 = resolve_settings({"mode": "palettize", "nbits": 4, "granularity": "per_grouped_channel"}, "v")
    assert tensor_bytes(64, 64, lut4) == 64 * 64 // 2 + (64 // 16) * 16 * 2  # indices + one LUT per 16 rows
    int8 = resolve_settings({"mode": "linear"}, "v")
    assert tensor_bytes(64, 64, int8) == 64 * 64 + 64 * 2  # + an fp16 scale per output channel
    assert tensor_bytes(8, 8, int8) == 8 * 8 * 2  # below weight_threshold: stays fp16
    with pytest.raises(ValueError, match="does not divide 513"):
        tensor_bytes(513, 64, lut4)
    s2 = FishConfig.from_dict(preset("fish-s2-pro").config)
    fp16 = frame_bytes(s2)
    assert sum(fp16.values()) == 15_572_211_712  # the fp16 figure of benchmarks/fish_runtime.py
    assert projection(fp16)["M2 Max"]["ms_per_frame"] == pytest.approx(51.907, abs=1e-3)


@pytest.fixture(scope="module")
def variant_build(fish_build, module_tmp):
    """The session's fish-tiny build plus a passing int8 variant and a failing 1-bit one."""
    work = module_tmp / "wf"
    shutil.copytree(fish_build, work, symlinks=True)
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["variants"] = {"int8": INT8, "lut1": LUT1}
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    proc = run_snakemake(work, "variants", "--keep-going", check=False)
    return work, proc


def test_compressed_scenario_stages_keep_shared_weights_and_states(variant_build):
    from anetts.mil import load_program

    work, proc = variant_build
    vdir = work / "artifacts" / MODEL / "variants" / "int8"
    for stage in ("slow_chunk0", "slow_chunk1", "fast_ar"):
        report = json.loads((vdir / "packages" / stage / "ctx256.json").read_text())
        assert report["compression"]["constexpr_ops"].get("constexpr_blockwise_shift_scale", 0) > 0, stage
        # the functions share one int8 copy: about half the fp16 bytes, not a copy per function
        assert report["compression"]["weight_ratio"] < 0.6, (stage, report["compression"])
        parity = json.loads((vdir / "parity" / stage / "ctx256.json").read_text())
        assert parity["calls"] > 1 and parity["passed"] and parity["default_gate"]["min_snr_db"] == 35
    slow = json.loads((vdir / "packages" / "slow_chunk0" / "ctx256.json").read_text())
    assert sorted(f["name"] for f in slow["functions"]) == ["decode", "prefill"]
    prog = load_program(vdir / "packages" / "slow_chunk0" / "ctx256.mlpackage")
    assert prog.make_state("decode")  # the KV cache states survive compression
    fast = json.loads((vdir / "parity" / "fast_ar" / "ctx256.json").read_text())
    assert fast["backends"]["mil"]["top1"]["logits"]["agreement"] >= 0.9
    # the last chunk's head stays fp16 (the stage keeps it uncompressed); the first chunk has none
    last = json.loads((vdir / "packages" / "slow_chunk1" / "ctx256.json").read_text())["compression"]
    assert list(last["uncompressed_weights"]) == ["head_weight"] and len(last["uncompressed_weights"]["head_weight"]) == 1
    assert slow["compression"]["uncompressed_weights"] == {}


def test_variant_chain_is_gated_and_in_the_manifest(variant_build):
    work, _ = variant_build
    vdir = work / "artifacts" / MODEL / "variants" / "int8"
    chain = json.loads((vdir / "chain" / "ctx256.json").read_text())
    assert chain["passed"] and chain["gate"]["min_top1"] == 0.9
    assert all("/variants/int8/" in p for p in chain["packages"].values())
    assert chain["teacher_forced"]["fast_codes_agreement"] >= 0.9
    manifest = json.loads((vdir / "manifest.json").read_text())
    assert [c["passed"] for c in manifest["chain"]] == [True]
    assert sorted(manifest["variant"]["compressed_stages"]) == ["fast_ar", "slow_chunk0", "slow_chunk1"]
    assert manifest["variant"]["uncompressed_stages"] == ["codec"]


def test_too_coarse_variant_fails_top1_and_leaves_nothing(variant_build):
    work, proc = variant_build
    assert proc.returncode != 0, "the 1-bit variant must fail its gate"
    lut1 = work / "artifacts" / MODEL / "variants" / "lut1"
    assert not (lut1 / "packages" / "fast_ar" / "ctx256.mlpackage").exists()
    assert not (lut1 / "manifest.json").exists() and not (lut1 / "chain").exists()
    failed = json.loads((lut1 / "parity" / "fast_ar" / "ctx256.failed.json").read_text())
    assert failed["backends"]["mil"]["top1"]["logits"]["agreement"] < 0.9
    out = proc.stdout + proc.stderr
    assert "lut1 fast_ar/ctx256 failed its gate" in out and "top-1" in out
    # a summary needs every variant whole
    assert not (work / "artifacts" / MODEL / "variants" / "summary.json").exists()


def test_summary_counts_bytes_per_frame(variant_build):
    work, _ = variant_build
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    del cfg["variants"]["lut1"]
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    run_snakemake(work, "variants")
    summary = json.loads((work / "artifacts" / MODEL / "variants" / "summary.json").read_text())
    base, int8 = summary["base"], summary["variants"]["int8"]
    assert 0.4 < int8["unique_weight_ratio"] < 0.75  # the codec stays fp16
    fb, fi = base["frame_cost"], int8["frame_cost"]
    assert fi["total_bytes_per_frame"] < 0.6 * fb["total_bytes_per_frame"]
    for cost in (fb, fi):  # the per-tensor model agrees with the packages' weight files
        assert cost["total_bytes_per_frame"] == pytest.approx(sum(cost["modelled_bytes_per_frame"].values()), rel=0.05)
    assert fi["projection"]["M2 Max"]["ms_per_frame"] < fb["projection"]["M2 Max"]["ms_per_frame"]
    md = (work / "artifacts" / MODEL / "variants" / "summary.md").read_text()
    assert "| int8 |" in md and "top-1" in md
