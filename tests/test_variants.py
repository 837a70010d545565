"""Compressed variants: config errors name the key; the DAG keeps a variant that passes its gate,
and leaves nothing of one that fails (the rule fails with the measured dB)."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from workflow_helpers import REPO, run_snakemake, small_config


def _variant_config(variants: dict) -> dict:
    cfg = small_config()
    cfg["variants"] = variants
    return cfg


def _vc(variants: dict):
    from anetts.variants import VariantConfig
    from anetts.workflow import WorkflowConfig

    cfg = _variant_config(variants)
    return VariantConfig(cfg, WorkflowConfig(cfg, root=REPO))


def _schema_errors(cfg: dict) -> str:
    import jsonschema

    schema = yaml.safe_load((REPO / "schemas" / "config.schema.yaml").read_text())
    return "\n".join(f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                     for e in jsonschema.Draft202012Validator(schema).iter_errors(cfg))


@pytest.mark.parametrize("variant, key", [
    ({"mode": "linear", "bitz": 4}, "bitz"),
    ({"mode": "palettize", "nbits": 5}, "nbits"),
    ({"mode": "gzip"}, "mode"),
    ({"mode": "linear", "gate": {"min_snr": 30}}, "min_snr"),
    ({"mode": "linear", "overrides": {"generator": {"nbitz": 4}}}, "nbitz"),
])
def test_schema_names_the_bad_key(variant, key):
    errors = _schema_errors(_variant_config({"v": variant}))
    assert errors and key in errors


@pytest.mark.parametrize("variant, key", [
    ({"mode": "palettize", "dtype": "int8"}, "variants.v.dtype"),  # a linear key on a LUT variant
    ({"mode": "linear", "stages": ["vocoder"]}, "variants.v.stages"),
    ({"mode": "linear", "stages": ["generator"], "overrides": {"duration": {"dtype": "uint8"}}}, "variants.v.overrides.duration"),
    # the kokoro generator targets macOS13: per-block int8 needs the iOS18 opset
    ({"mode": "linear", "granularity": "per_block", "stages": ["generator"]}, "variants.v.granularity"),
    ({"mode": "palettize", "granularity": "per_channel"}, "variants.v.granularity"),
])
def test_variant_config_errors_name_the_key(variant, key):
    from anetts.workflow import ConfigError

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _vc({"v": variant})


def test_defaults_fill_in_and_gate_overrides():
    vc = _vc({"v": {"mode": "palettize", "nbits": 4, "stages": ["generator", "duration"],
                    "overrides": {"duration": {"nbits": 8}}, "gate": {"min_snr_db": 20}}})
    assert vc.stages("kokoro-tiny", "v") == ["duration", "generator"]  # the model's stage order
    g = vc.settings("kokoro-tiny", "v", "generator")
    assert (g["nbits"], g["algorithm"], g["granularity"], g["weight_threshold"]) == (4, "kmeans", "per_tensor", 2048)
    assert vc.settings("kokoro-tiny", "v", "duration")["nbits"] == 8
    gate = vc.gate("kokoro-tiny", "v", "generator")
    assert gate["min_snr_db"] == 20 and gate["target_snr_db"] == 50  # the rest from parity.default
    assert vc.in_all() == [] and vc.targets("kokoro-tiny", vc.in_all()) == []
    # stages a variant leaves alone keep the base package in its manifest
    pkgs = vc.packages("kokoro-tiny", "v")
    assert any("/variants/v/packages/generator/" in p for p in pkgs)
    assert any(p.endswith("packages/f0ntrain/3s.mlpackage") and "/variants/" not in p for p in pkgs)


@pytest.fixture(scope="module")
def variant_build(built_workflow, module_tmp):
    """The session's kokoro-tiny build plus two variants: int8 on decoder_pre (a tolerant stage) and
    a 2-entry LUT on the duration stage (sensitive: its integer durations must stay exact)."""
    work = module_tmp / "wf"
    shutil.copytree(built_workflow, work, symlinks=True)
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["variants"] = {
        # int8 per-channel measured 30.7 dB on this decoder_pre (the default gate is 35): the variant
        # sets its own gate, reported beside the default one
        "int8": {"mode": "linear", "dtype": "int8", "granularity": "per_channel", "stages": ["decoder_pre"],
                 "gate": {"min_snr_db": 25}},
        "lut1": {"mode": "palettize", "nbits": 1, "stages": ["duration"], "weight_threshold": 256},
    }
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    proc = run_snakemake(work, "variants", "--keep-going", check=False)
    return work, proc


def test_variant_gate_keeps_passing_and_drops_failing(variant_build):
    work, proc = variant_build
    assert proc.returncode != 0, "the lut1 variant must fail its gate"
    out = proc.stdout + proc.stderr
    model = work / "artifacts" / "kokoro-tiny"
    # failing: no package, no report, no manifest; the measured numbers are in the failed report
    lut1 = model / "variants" / "lut1"
    assert not (lut1 / "packages" / "duration" / "t32.mlpackage").exists()
    assert not (lut1 / "packages" / "duration" / "t32.json").exists()
    assert not (lut1 / "manifest.json").exists()
    failed = json.loads((lut1 / "parity" / "duration" / "t32.failed.json").read_text())
    assert failed["passed"] is False and failed["variant"] == "lut1"
    log = (model / "logs" / "compress" / "lut1" / "duration" / "t32.log").read_text()
    assert "lut1 duration/t32 failed its gate" in log and "lut1 duration/t32 failed its gate" in out and "dB" in log
    # passing: compressed package, report, gate, manifest that the runtime loads
    int8 = model / "variants" / "int8"
    report = json.loads((int8 / "packages" / "decoder_pre" / "3s.json").read_text())
    assert report["compression"]["constexpr_ops"].get("constexpr_affine_dequantize", 0) > 0
    assert report["compression"]["weight_ratio"] < 0.6
    parity = json.loads((int8 / "parity" / "decoder_pre" / "3s.json").read_text())
    assert parity["passed"] and parity["backends"]["mil"]["min_snr_db"] >= parity["gate"]["min_snr_db"] == 25
    assert parity["default_gate"]["min_snr_db"] == 35
    manifest = json.loads((int8 / "manifest.json").read_text())
    assert manifest["variant"]["name"] == "int8" and list(manifest["variant"]["compressed_stages"]) == ["decoder_pre"]


def test_variant_manifest_runs_in_the_runtime(variant_build):
    from anetts.mil import load_program
    from anetts.loader import load
    from anetts.runtime.errors import ArtifactError

    work, _ = variant_build
    vdir = work / "artifacts" / "kokoro-tiny" / "variants" / "int8"
    tts = load(vdir)  # off macOS a variant defaults to the MIL executor (its TorchScript is uncompressed)
    assert tts.backend.name == ("coreml" if sys.platform == "darwin" else "mil")
    entries = {e.stage: e for e in tts.artifacts.packages.values()}
    assert entries["decoder_pre"].path.resolve().is_relative_to(vdir.resolve())
    assert not entries["duration"].path.resolve().is_relative_to(vdir.resolve())  # the base package
    prog = load_program(entries["decoder_pre"].path)  # the executor runs the constexpr program
    assert prog.op_types()
    result = tts.synthesize(phonemes="həlˈO.", voice="syn_a")
    assert result.audio.size > 0 and abs(result.audio).max() > 0
    with pytest.raises(ArtifactError, match="TorchScript"):  # the export is not the compressed model
        load(vdir, backend="torch")


def test_exclude_filter_that_matches_nothing_is_named(built_workflow, tmp_path):
    from anetts.compile.compress import CompressionError, compress_model, resolve_settings

    pkg = Path(built_workflow) / "artifacts" / "kokoro-tiny" / "packages" / "decoder_pre" / "3s.mlpackage"
    settings = resolve_settings({"mode": "linear", "exclude_op_types": ["einsum_nope"]}, "variants.v")
    with pytest.raises(CompressionError, match=r"variants\.v\.exclude_op_types: \['einsum_nope'\]"):
        compress_model(pkg, settings, "variants.v")


def test_exclude_op_names_resolve_and_validate():
    from anetts.compile.compress import CompressionError, resolve_settings

    s = resolve_settings({"mode": "palettize", "exclude_op_names": ["b", "a", "b"]}, "variants.v")
    assert s["exclude_op_names"] == ["a", "b"]
    assert resolve_settings({"mode": "linear"}, "variants.v")["exclude_op_names"] == []
    with pytest.raises(CompressionError, match=r"variants\.v\.exclude_op_names"):
        resolve_settings({"mode": "linear", "exclude_op_names": "conv_0_weight"}, "variants.v")
    assert not _schema_errors(_variant_config({"v": {"mode": "linear", "exclude_op_names": ["w"]}}))
    assert "exclude_op_names" in _schema_errors(_variant_config({"v": {"mode": "linear", "exclude_op_names": [1]}}))


def test_exclude_op_names_keep_that_weight_and_name_a_miss(built_workflow):
    from anetts.compile.compress import CompressionError, _ct, compress_model, resolve_settings

    pkg = Path(built_workflow) / "artifacts" / "kokoro-tiny" / "packages" / "decoder_pre" / "3s.mlpackage"
    settings = resolve_settings({"mode": "linear", "exclude_op_names": ["no_such_weight"]}, "variants.v")
    with pytest.raises(CompressionError, match=r"variants\.v\.exclude_op_names: \['no_such_weight'\]"):
        compress_model(pkg, settings, "variants.v")

    def ops(model):
        prog = model.get_spec().mlProgram
        return [op for f in prog.functions.values() for b in f.block_specializations.values() for op in b.operations]

    def const_names(model):
        return {o.name for op in ops(model) if op.type == "const" for o in op.outputs}

    def constexprs(model):
        return [o.name for op in ops(model) if op.type.startswith("constexpr_") for o in op.outputs]

    base = _ct().models.MLModel(str(pkg), skip_model_load=True)
    all_in, _, _ = compress_model(pkg, resolve_settings({"mode": "linear"}, "variants.v"), "variants.v")
    # a weight the defaults compress (coremltools names its constexpr `<const>_<suffix>`)
    name = sorted(n for n in const_names(base) - const_names(all_in)
                  if any(c.startswith(n + "_") for c in constexprs(all_in)))[0]
    kept, _, _ = compress_model(pkg, resolve_settings({"mode": "linear", "exclude_op_names": [name]}, "v"), "v")
    assert name in const_names(kept) and len(constexprs(kept)) == len(constexprs(all_in)) - 1
