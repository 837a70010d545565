"""`fp32_ops`: named ops / op types computed in fp32 inside an fp16 program (kokoro-tiny generator)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from anetts.compile.convert import ConversionError, ConvertOptions, convert_export
from anetts.compile.inspect import load_spec
from anetts.compile.export import export_stage
from anetts.families import get_family
from anetts.options import Gate
from anetts.verify.parity import run_parity

FAMILY = get_family("kokoro")
META = {"model": "kokoro-tiny", "family": "kokoro", "source": "synthetic", "revision": "test"}
REPO = Path(__file__).resolve().parents[2]


def _generator_block() -> dict:
    cfg = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    return {k: v for k, v in cfg["families"]["kokoro"]["stages"]["generator"].items() if k != "buckets"}


@pytest.fixture(scope="module")
def exported_generator(tiny_weights, tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("gen_export")
    export_stage(FAMILY, "generator", "3s", 3, None, tiny_weights, None, out / "3s.functions",
                 out / "3s.scenario.npz", out / "3s.export.json", model=tiny_model)
    return out


@pytest.fixture(scope="module")
def mixed(exported_generator, tmp_path_factory):
    """The generator converted with config.yaml's own generator options (its fp32_ops)."""
    options = ConvertOptions.make(**_generator_block())
    assert options.precision == "fp16" and options.fp32_ops, "config.yaml's generator sets fp32_ops"
    out = tmp_path_factory.mktemp("gen_mixed")
    e = exported_generator
    report = convert_export(e / "3s.functions", e / "3s.export.json", out / "3s.mlpackage", out / "3s.json", options, META,
                            out_inspect=out / "3s.inspect.json")
    return options, out, report


def _op_dtypes(package: Path) -> list[tuple[str, str, list[str]]]:
    """(op type, output name, output dtypes) of every op of `main`, nested blocks included."""
    from coremltools.proto import MIL_pb2

    spec = load_spec(package)
    names = {v: k for k, v in MIL_pb2.DataType.items()}
    rows = []

    def walk(block):
        for op in block.operations:
            dts = [names[o.type.tensorType.dataType] for o in op.outputs if o.type.WhichOneof("type") == "tensorType"]
            rows.append((op.type, op.outputs[0].name if op.outputs else "", dts))
            for b in op.blocks:
                walk(b)

    fn = spec.mlProgram.functions["main"]
    walk(fn.block_specializations[fn.opset])
    return rows


def test_selected_ops_compute_in_fp32(mixed):
    options, out, report = mixed
    rows = _op_dtypes(out / "3s.mlpackage")

    def dtypes(op_type):
        return [d for t, _, ds in rows if t == op_type for d in ds]

    # selected by type: every one of them is fp32 in the saved program
    for t in ("exp", "sin", "cos", "pow", "rsqrt", "reduce_mean"):
        assert dtypes(t) and set(dtypes(t)) == {"FLOAT32"}, t
    # convolutions are not selected, except conv_post and the inverse STFT: those alone are fp32
    assert dtypes("conv").count("FLOAT32") == 1 and dtypes("conv").count("FLOAT16") > 1
    assert dtypes("conv_transpose").count("FLOAT32") == 3  # the inverse STFT's real, imaginary and envelope
    assert "FLOAT16" in dtypes("conv_transpose")  # the ups stay fp16
    assert "cast" in {t for t, _, _ in rows}  # at the fp16/fp32 boundaries
    # the report says what each selector kept; the lint counts the fp32 ops (the ANE cost)
    assert set(report["fp32_ops"]) == set(options.fp32_ops) and all(report["fp32_ops"].values())
    assert report["fp32_ops"]["module:conv_post"] == {"conv": 1}
    assert report["fp32_ops"]["module:spectrum"] == {"exp": 1, "sin": 1, "slice_by_index": 2}
    lint = {f["rule"]: f for f in report["lint"]}
    assert lint["fp32_compute"]["op_types"]["exp"] == 1 and lint["fp32_compute"]["op_types"]["conv"] == 1
    info = json.loads((out / "3s.inspect.json").read_text())
    assert json.loads(info["metadata"]["user_defined"]["anetts.fp32_ops"]) == list(options.fp32_ops)
    assert info["functions"]["main"]["weight_dtypes"]["float16"] > info["functions"]["main"]["weight_dtypes"]["float32"]


def test_mixed_program_passes_parity(mixed, exported_generator):
    """The MIL executor runs the mixed program (casts included) and it passes the gate."""
    _, out, _ = mixed
    e = exported_generator
    rep = run_parity(out / "3s.mlpackage", e / "3s.scenario.npz", e / "3s.export.json", Gate.make())
    assert rep["passed"], rep["backends"]["mil"]
    assert rep["backends"]["mil"]["min_snr_db"] >= Gate.make().target_snr_db


def test_selector_matching_nothing_fails_and_leaves_nothing(exported_generator, tmp_path):
    e = exported_generator
    pkg, report = tmp_path / "3s.mlpackage", tmp_path / "3s.json"
    options = ConvertOptions.make(fp32_ops=["module:conv_post", "module:no_such_module", "op:no_such_op"])
    with pytest.raises(ConversionError, match=r"generator/3s: fp32_ops selector\(s\) \['module:no_such_module', "
                                              r"'op:no_such_op'\] matched no op"):
        convert_export(e / "3s.functions", e / "3s.export.json", pkg, report, options, META)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fp32_ops, precision, message", [
    (["conv_post"], "fp16", r"fp32_ops selector 'conv_post' is not one of"),
    (["module:"], "fp16", r"fp32_ops selector 'module:' is not one of"),
    (["op:exp"], "fp32", r"fp32_ops \['op:exp'\] need precision fp16"),
])
def test_bad_fp32_ops_fail_before_converting(exported_generator, tmp_path, fp32_ops, precision, message):
    e = exported_generator
    with pytest.raises(ConversionError, match=message):
        convert_export(e / "3s.functions", e / "3s.export.json", tmp_path / "p.mlpackage", tmp_path / "p.json",
                       ConvertOptions.make(fp32_ops=fp32_ops, precision=precision), META)
    assert list(tmp_path.iterdir()) == []


def test_default_is_none_and_order_is_canonical():
    assert ConvertOptions().fp32_ops == ()
    assert ConvertOptions.make(fp32_ops=["op:sin", "module:conv_post"]).fp32_ops == ("module:conv_post", "op:sin")


def test_schema_rejects_a_malformed_selector():
    import jsonschema

    from anetts.options import schema

    cfg = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    jsonschema.validate(cfg, schema())
    cfg["families"]["kokoro"]["stages"]["generator"]["fp32_ops"] = ["conv post"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(cfg, schema())
