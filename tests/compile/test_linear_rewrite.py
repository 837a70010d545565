"""Linear -> Conv rewrite (anetts.compile.rewrite) on tiny converted modules."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from anetts.compile.convert import op_histogram
from anetts.compile.rewrite import (LINEAR_VARIANTS, RewriteError, count_linear, make_pass_pipeline,
                                  rewrite_package)


class Linears(nn.Module):
    """nn.Linear on rank-1, rank-2 (AdaIN fc on the style vector), rank-3 and rank-4 inputs."""

    def __init__(self):
        super().__init__()
        from kokoro.istftnet import AdaIN1d

        self.a = nn.Linear(16, 24)
        self.b = nn.Linear(24, 8)
        self.ada = AdaIN1d(128, 8)  # fc: Linear(128 -> 16) on (1, 128)
        self.c = nn.Linear(8, 6, bias=False)
        self.d = nn.Linear(8, 3)

    def forward(self, x, style, v):
        h = self.b(torch.relu(self.a(x)))  # (1, T, 16) -> (1, T, 8): rank 3, twice
        h = self.ada(h.transpose(1, 2), style)  # (1, 8, T)
        o = self.c(v)  # (2, 3, 5, 8) -> (2, 3, 5, 6): rank 4
        r = self.d(v[0, 0, 0])  # (8,) -> (3,): rank 1
        return h, o, r


N_LINEAR = 5


def _example():
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(1, 20, 16, generator=g), "style": torch.randn(1, 128, generator=g),
            "v": torch.randn(2, 3, 5, 8, generator=g)}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Linears().eval()


@pytest.fixture(scope="module")
def packages(tmp_path_factory, convert_module, model):
    d = tmp_path_factory.mktemp("rewrite")
    out = {}
    reports = {}
    for variant in LINEAR_VARIANTS:
        out[variant] = d / f"{variant}.mlpackage"
        reports[variant] = convert_module(model, _example(), out[variant], outputs=("h", "o", "r"),
                                          variant=variant, where=f"linears/{variant}")
    return out, reports


def test_baseline_has_linear_ops(packages):
    pkgs, reports = packages
    hist = op_histogram(pkgs["none"])["main"]
    assert hist.get("linear") == N_LINEAR
    assert reports["none"]["rewritten"] == 0


@pytest.mark.parametrize("variant", ["conv1d", "conv2d"])
def test_rewrite_removes_every_linear(packages, variant):
    pkgs, reports = packages
    base = op_histogram(pkgs["none"])["main"]
    hist = op_histogram(pkgs[variant])["main"]
    assert hist.get("linear", 0) == 0
    assert count_linear(pkgs[variant]) == 0
    assert hist.get("conv", 0) == base.get("conv", 0) + N_LINEAR
    rep = reports[variant]
    assert rep["rewritten"] == N_LINEAR and rep["linear_remaining"] == 0 and rep["skipped"] == []
    assert rep["by_input_rank"] == {"1": 1, "2": 1, "3": 2, "4": 1}


@pytest.mark.parametrize("variant,rank", [("conv1d", 3), ("conv2d", 4)])
def test_conv_layout(packages, variant, rank):
    """conv1d: (B, C, L) convs with [Cout, Cin, 1] weights; conv2d: BC1S with [Cout, Cin, 1, 1]."""
    import coremltools as ct

    spec = ct.utils.load_spec(str(packages[0][variant]))
    fn = spec.mlProgram.functions["main"]
    block = fn.block_specializations[fn.opset]
    convs = [op for op in block.operations if op.type == "conv"]
    assert len(convs) == N_LINEAR
    assert {int(op.outputs[0].type.tensorType.rank) for op in convs} == {rank}
    # the fp16 cast pass ran after the rewrite: the conv computes in fp16
    assert {op.outputs[0].type.tensorType.dataType for op in convs} == {ct.proto.MIL_pb2.FLOAT16}


@pytest.mark.parametrize("variant", ["conv1d", "conv2d"])
def test_conv_weights_keep_the_linear_weights_names(packages, variant):
    """Each conv's weight const is named after the linear's weight (what a variant's exclude_op_names
    or a stage's uncompressed_weights names), as the unrewritten program's are."""
    import coremltools as ct

    def weight_names(package, op_type):
        spec = ct.utils.load_spec(str(package))
        fn = spec.mlProgram.functions["main"]
        ops = fn.block_specializations[fn.opset].operations
        return sorted(op.inputs["weight"].arguments[0].name for op in ops if op.type == op_type)

    base = weight_names(packages[0]["none"], "linear")
    conv = weight_names(packages[0][variant], "conv")
    assert len(conv) == N_LINEAR and len(base) == N_LINEAR
    assert all(any(c.startswith(b.removesuffix("_to_fp16") + "_conv_") for c in conv) for b in base), (base, conv)


@pytest.mark.parametrize("variant", ["conv1d", "conv2d"])
def test_rewritten_program_computes_the_same(packages, variant, load_program, model):
    pkgs, _ = packages
    ex = _example()
    feeds = {k: v.numpy() for k, v in ex.items()}
    ref = load_program(pkgs["none"]).run(feeds)
    got = load_program(pkgs[variant]).run(feeds)
    assert set(got) == {"h", "o", "r"}
    for k in ref:
        assert got[k].shape == ref[k].shape
        np.testing.assert_allclose(got[k], ref[k], rtol=0, atol=2e-3, err_msg=k)
    with torch.no_grad():  # and both match torch within fp16 error
        want = dict(zip(("h", "o", "r"), (t.numpy() for t in model(**ex))))
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=2e-2, err_msg=k)


def test_torch_side_math_is_exact():
    """The rewrite's identity: linear(x, W, b) == conv(x as (B, C, 1, S), W[:, :, None, None], b)."""
    torch.manual_seed(1)
    lin = nn.Linear(12, 7).double()
    x = torch.randn(2, 9, 12, dtype=torch.float64)
    y = lin(x)
    w = lin.weight.reshape(7, 12, 1, 1)
    y2 = torch.nn.functional.conv2d(x.transpose(1, 2).unsqueeze(2), w, lin.bias).squeeze(2).transpose(1, 2)
    w1 = lin.weight.reshape(7, 12, 1)
    y1 = torch.nn.functional.conv1d(x.transpose(1, 2), w1, lin.bias).transpose(1, 2)
    assert torch.allclose(y, y2, atol=1e-12) and torch.allclose(y, y1, atol=1e-12)


class NoLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))


def test_rewrite_matching_nothing_is_an_error(tmp_path, convert_module):
    with pytest.raises(RewriteError, match=r"matched no linear op in stageX/b1"):
        convert_module(NoLinear(), {"x": torch.randn(1, 4, 10)}, tmp_path / "x.mlpackage",
                       variant="conv2d", where="stageX/b1")
    # "none", and the default "auto", on the same module are fine: there is nothing to rewrite
    for variant in ("none", "auto"):
        rep = convert_module(NoLinear(), {"x": torch.randn(1, 4, 10)}, tmp_path / f"{variant}.mlpackage", variant=variant)
        assert rep["rewritten"] == 0


def test_auto_rewrites_like_conv1d(packages):
    pkgs, reports = packages
    assert op_histogram(pkgs["auto"])["main"] == op_histogram(pkgs["conv1d"])["main"]
    assert reports["auto"]["rewritten"] == N_LINEAR and reports["auto"]["linear_remaining"] == 0


def test_variant_validation():
    assert make_pass_pipeline("none") is None
    with pytest.raises(RewriteError, match="unknown linear rewrite variant"):
        make_pass_pipeline("conv3d")
    p = make_pass_pipeline("conv2d")
    names = list(p.passes)
    # inserted after compose_conv1d (which would fold conv2d back) and before the fp16 casts
    i = names.index("anetts::linear_to_conv")
    assert names[i - 1] == "common::compose_conv1d"
    assert i < names.index("common::add_fp16_cast") and i < names.index("common::reduce_transposes")


@pytest.mark.parametrize("variant", ["conv2d"])
def test_rewrite_saved_package(packages, tmp_path, variant, load_program):
    """Post-hoc rewrite of an already converted fp16 package: same I/O, metadata, values."""
    import coremltools as ct

    src = packages[0]["none"]
    dst = tmp_path / "post.mlpackage"
    rep = rewrite_package(src, dst, variant, where="linears/post")
    assert rep["rewritten"] == N_LINEAR and rep["linear_remaining"] == 0
    assert op_histogram(dst)["main"].get("linear", 0) == 0
    m = ct.models.MLModel(str(dst), skip_model_load=True)
    assert m.user_defined_metadata["anetts.linear_rewrite"] == variant
    feeds = {k: v.numpy() for k, v in _example().items()}
    ref = load_program(src).run(feeds)
    got = load_program(dst).run(feeds)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=0, atol=2e-3, err_msg=k)
    with pytest.raises(RewriteError, match="matched no linear op"):
        rewrite_package(dst, tmp_path / "again.mlpackage", variant)
    assert not (tmp_path / "again.mlpackage").exists()


def test_rewrite_multifunction_package_keeps_weight_sharing(packages, tmp_path, load_program):
    from anetts.compile.bundle import bundle_packages
    from anetts.compile.inspect import inspect_package

    src = packages[0]["none"]
    bundle = tmp_path / "bundle.mlpackage"
    bundle_packages({"a": src, "b": src}, bundle, default_function="b")
    dst = tmp_path / "bundle_conv2d.mlpackage"
    rep = rewrite_package(bundle, dst, "conv2d")
    assert rep["rewritten"] == 2 * N_LINEAR and rep["linear_remaining"] == 0
    before, after = inspect_package(bundle), inspect_package(dst)
    assert after["default_function"] == "b" and list(after["functions"]) == ["a", "b"]
    assert after["weight_bytes_unique"] == before["weight_bytes_unique"]  # still shared once
    feeds = {k: v.numpy() for k, v in _example().items()}
    ref = load_program(src).run(feeds)
    got = load_program(dst).run(feeds, function_name="a")
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=0, atol=2e-3, err_msg=k)
