"""Program-level behaviour: packages on disk, input validation, unsupported ops,
multifunction packages, compressed (constexpr) weights, the run-mil CLI."""
from __future__ import annotations

import numpy as np
import pytest
import coremltools as ct
from coremltools.converters.mil.mil import Builder as mb
from coremltools.converters.mil.mil import types

from anetts.mil import MilInputError, UnsupportedOpError, load_program
from anetts.mil.cli import main as cli_main
from miltest import assert_close, rng

R = rng(10)
W = R.standard_normal((64, 48)).astype(np.float32)  # > 2048 elements: stored in weight.bin


def _save(prog_fn, path, target=ct.target.iOS16, **kw):
    ml = ct.convert(prog_fn, convert_to="mlprogram", minimum_deployment_target=target,
                    pass_pipeline=kw.pop("pass_pipeline", ct.PassPipeline.EMPTY), **kw)
    ml.save(str(path))
    return ml


@pytest.fixture(scope="module")
def linear_pkg(tmp_path_factory):
    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 48), dtype=types.fp32)], opset_version=ct.target.iOS16)
    def prog(x):
        return mb.relu(x=mb.linear(x=x, weight=W, name="lin"), name="y")

    path = tmp_path_factory.mktemp("pk") / "linear.mlpackage"
    _save(prog, path)
    return path


def test_package_with_weight_blob(linear_pkg):
    assert (linear_pkg / "Data/com.apple.CoreML/weights/weight.bin").exists()
    prog = load_program(linear_pkg)
    assert prog.function_names == ["main"]
    assert prog.output_names() == ["y"]
    [spec] = prog.input_specs()
    assert (spec.name, spec.shape, spec.dtype) == ("x", (2, 48), np.float32)
    x = R.standard_normal((2, 48)).astype(np.float32)
    out = prog.run({"x": x})
    assert out["y"].dtype == np.float32
    assert_close(out["y"], np.maximum(x @ W.T, 0), rtol=1e-5, atol=1e-5)
    assert_close(prog.run({"x": x.astype(np.float64)})["y"], out["y"])  # float64 -> fp32 accepted


def test_input_validation_names_the_input(linear_pkg):
    prog = load_program(linear_pkg)
    x = np.zeros((2, 48), np.float32)
    with pytest.raises(MilInputError, match="missing input.*'x'"):
        prog.run({})
    with pytest.raises(MilInputError, match="unexpected input.*'z'"):
        prog.run({"x": x, "z": x})
    with pytest.raises(MilInputError, match="'x'.*shape"):
        prog.run({"x": np.zeros((3, 48), np.float32)})
    with pytest.raises(MilInputError, match="'x'.*fp32"):
        prog.run({"x": np.zeros((2, 48), np.int32)})
    with pytest.raises(MilInputError, match="no function 'nope'"):
        prog.run({"x": x}, function_name="nope")


def test_int32_input_range_checked(tmp_path):
    @mb.program(input_specs=[mb.TensorSpec(shape=(3,), dtype=types.int32)], opset_version=ct.target.iOS16)
    def prog(i):
        return mb.gather(x=np.arange(10, dtype=np.float32), indices=i, name="y")

    _save(prog, tmp_path / "g.mlpackage")
    p = load_program(tmp_path / "g.mlpackage")
    assert_close(p.run({"i": np.array([1, 2, 9], np.int64)})["y"], [1, 2, 9])
    with pytest.raises(MilInputError, match="'i'.*int32 range"):
        p.run({"i": np.array([1, 2, 2**40], np.int64)})
    with pytest.raises(MilInputError, match="'i' must be int32"):
        p.run({"i": np.array([1.0, 2.0, 3.0])})


def test_unsupported_ops_reported_at_load(tmp_path):
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 4), dtype=types.fp32)], opset_version=ct.target.iOS16)
    def prog(x):
        noise = mb.random_normal(shape=np.array([1, 4], np.int32), mean=0.0, stddev=1.0)
        y = mb.expand_dims(x=mb.add(x=x, y=noise), axes=[-1])
        return mb.local_response_norm(x=y, size=3, name="y")

    path = tmp_path / "bad.mlpackage"
    _save(prog, path)
    with pytest.raises(UnsupportedOpError) as err:
        load_program(path)
    msg = str(err.value)
    assert str(path) in msg and "random_normal" in msg and "local_response_norm" in msg
    assert set(err.value.op_types) == {"local_response_norm", "random_normal"}


def test_unsupported_attribute_reported(tmp_path):
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 4, 6), dtype=types.fp32)], opset_version=ct.target.iOS16)
    def prog(x):
        return mb.max_pool(x=x, kernel_sizes=[2], strides=[2], pad_type="valid", ceil_mode=True, name="y")

    _save(prog, tmp_path / "ceil.mlpackage")
    with pytest.raises(UnsupportedOpError, match="max_pool: ceil_mode"):
        load_program(tmp_path / "ceil.mlpackage")


def test_multifunction_package(tmp_path):
    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 48), dtype=types.fp32)], opset_version=ct.target.iOS18)
    def p1(x):
        return mb.linear(x=x, weight=W, name="y")

    @mb.program(input_specs=[mb.TensorSpec(shape=(5, 48), dtype=types.fp32)], opset_version=ct.target.iOS18)
    def p2(x):
        return mb.tanh(x=mb.linear(x=x, weight=W), name="z")

    _save(p1, tmp_path / "a.mlpackage", target=ct.target.iOS18)
    _save(p2, tmp_path / "b.mlpackage", target=ct.target.iOS18)
    desc = ct.utils.MultiFunctionDescriptor()
    desc.add_function(str(tmp_path / "a.mlpackage"), "main", "short")
    desc.add_function(str(tmp_path / "b.mlpackage"), "main", "long")
    desc.default_function_name = "long"
    ct.utils.save_multifunction(desc, str(tmp_path / "multi.mlpackage"))

    prog = load_program(tmp_path / "multi.mlpackage")
    assert sorted(prog.function_names) == ["long", "short"]
    assert prog.default_function == "long"
    assert prog.input_specs("short")[0].shape == (2, 48)
    assert prog.input_specs()[0].shape == (5, 48)
    x2, x5 = R.standard_normal((2, 48)).astype(np.float32), R.standard_normal((5, 48)).astype(np.float32)
    assert_close(prog.run({"x": x2}, "short")["y"], x2 @ W.T, rtol=1e-5, atol=1e-5)
    assert_close(prog.run({"x": x5})["z"], np.tanh(x5 @ W.T), rtol=1e-5, atol=1e-5)
    assert prog.output_names("short") == ["y"]


@pytest.mark.parametrize("mode", ["palettize", "linear_quantize", "prune"])
@pytest.mark.parametrize("target", [ct.target.iOS16, ct.target.iOS18])
def test_compressed_weights_constexpr(tmp_path, mode, target):
    """ct.optimize writes constexpr_* ops; they are folded at load time."""
    import coremltools.optimize.coreml as cto

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 48), dtype=types.fp32)], opset_version=target)
    def prog(x):
        return mb.linear(x=x, weight=W, name="y")

    ml = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=target,
                    compute_precision=ct.precision.FLOAT32)
    if mode == "palettize":
        cfg = cto.OptimizationConfig(global_config=cto.OpPalettizerConfig(nbits=4, mode="uniform"))
        ml = cto.palettize_weights(ml, cfg)
    elif mode == "linear_quantize":
        cfg = cto.OptimizationConfig(global_config=cto.OpLinearQuantizerConfig(mode="linear_symmetric"))
        ml = cto.linear_quantize_weights(ml, cfg)
    else:
        cfg = cto.OptimizationConfig(global_config=cto.OpMagnitudePrunerConfig(target_sparsity=0.5))
        ml = cto.prune_weights(ml, cfg)
    path = tmp_path / f"{mode}.mlpackage"
    ml.save(str(path))
    spec = ct.utils.load_spec(str(path))
    ops = [op.type for op in spec.mlProgram.functions["main"].block_specializations[
        spec.mlProgram.functions["main"].opset].operations]
    assert any(t.startswith("constexpr_") for t in ops), ops
    # reference: the decompressed weight as coremltools' own pymil program holds it
    from coremltools.converters.mil.frontend.milproto.load import load as milproto_load

    pymil = milproto_load(spec, specification_version=spec.specificationVersion,
                          file_weights_dir=str(path / "Data/com.apple.CoreML/weights"))
    [cop] = [op for op in pymil.functions["main"].operations if op.op_type.startswith("constexpr_")]
    w_ref = cop.materialized_val_inference()
    w_ref = w_ref[-1] if isinstance(w_ref, tuple) else w_ref
    x = R.standard_normal((2, 48)).astype(np.float32)
    got = load_program(path).run({"x": x})["y"]
    assert_close(got, x @ np.asarray(w_ref, np.float64).T, rtol=1e-4, atol=1e-4)
    assert np.abs(got - x @ W.T).max() < 0.5 * np.abs(x @ W.T).max()  # and still roughly the layer


def test_cli(linear_pkg, tmp_path, capsys):
    x = R.standard_normal((2, 48)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    rc = cli_main([str(linear_pkg), "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "y: shape=(2, 64) dtype=float32" in out and "mean=" in out
    with np.load(tmp_path / "out.npz") as npz:
        assert_close(npz["y"], np.maximum(x @ W.T, 0), rtol=1e-5, atol=1e-5)
    assert cli_main([str(linear_pkg), "--list"]) == 0
    assert "input  x: fp32 [2x48]" in capsys.readouterr().out
    np.savez(tmp_path / "bad.npz", q=x)
    assert cli_main([str(linear_pkg), "--inputs", str(tmp_path / "bad.npz")]) == 1
    assert "missing input" in capsys.readouterr().err
