"""Multifunction bundles (anetts.compile.bundle) of per-bucket packages of a tiny conv model."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from anetts.compile.bundle import BundleError, bundle_packages, function_name
from anetts.compile.inspect import function_io, inspect_package, load_spec

BUCKETS = {"t16": 16, "t40": 40}


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(96, 96, 5, padding=2)
        self.c2 = nn.Conv1d(96, 32, 3, padding=1)

    def forward(self, x):
        return self.c2(torch.relu(self.c1(x)))


@pytest.fixture(scope="module")
def buckets(tmp_path_factory, convert_module):
    d = tmp_path_factory.mktemp("buckets")
    torch.manual_seed(0)
    model = Tiny().eval()
    out = {}
    for name, t in BUCKETS.items():
        out[name] = d / f"{name}.mlpackage"
        convert_module(model, {"x": torch.randn(1, 96, t)}, out[name],
                       metadata={"anetts.stage": "tiny", "anetts.bucket": name, "anetts.precision": "fp16"})
    return out


@pytest.fixture(scope="module")
def bundle(buckets, tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "tiny.mlpackage"
    return out, bundle_packages(buckets, out, default_function="t16")


def test_bundle_structure(bundle, buckets):
    out, rep = bundle
    spec = load_spec(out)
    assert [f.name for f in spec.description.functions] == ["t16", "t40"]
    assert spec.description.defaultFunctionName == "t16"
    # multifunction needs iOS18/macOS15: save_multifunction upgrades the macOS13 (7) sources
    assert rep["specification_version"] == 9 and rep["specification_version_sources"] == [7]
    assert rep["spec_upgraded"] is True
    io = function_io(spec)
    for name, t in BUCKETS.items():
        assert io[name]["inputs"][0]["shape"] == [1, 96, t]
        assert io[name]["outputs"][0]["shape"] == [1, 32, t]
        assert io[name] == function_io(load_spec(buckets[name]))["main"]
        assert rep["functions"][name]["inputs"][0]["shape"] == [1, 96, t]
    md = dict(spec.description.metadata.userDefined)
    assert md["anetts.stage"] == "tiny" and "anetts.bucket" not in md
    assert md["anetts.default_function"] == "t16" and md["anetts.buckets"] == '["t16", "t40"]'


def test_bundle_dedups_weights(bundle, buckets):
    out, rep = bundle
    one = rep["input_bytes_sum"] / 2
    params = 96 * 96 * 5 + 96 + 32 * 96 * 3 + 32
    assert rep["weight_bytes_fp16"] == rep["largest_function_weight_bytes_fp16"] >= params * 2
    assert rep["weights_shared"] is True
    assert rep["bundle_bytes"] < 1.1 * one  # about one package, not two
    assert rep["ratio"] == pytest.approx(rep["bundle_bytes"] / rep["weight_bytes_fp16"], rel=1e-3)
    assert rep["ratio"] <= 1.15 and rep["goal_met"] is True
    assert rep["function_specific_weight_bytes"] == 0
    assert set(rep["bundle_weight_bytes_by_dtype"]) == {"float16"}
    info = inspect_package(out)
    assert info["weight_bytes_unique"] == rep["bundle_weight_bytes"]
    assert info["functions"]["t16"]["weight_bytes_blob"] == info["functions"]["t40"]["weight_bytes_blob"]


def test_bundle_functions_compute_like_sources(bundle, buckets, load_program):
    out, _ = bundle
    prog = load_program(out)
    assert sorted(prog.function_names) == ["t16", "t40"]
    rng = np.random.default_rng(0)
    for name, t in BUCKETS.items():
        x = {"x": rng.standard_normal((1, 96, t)).astype(np.float32)}
        want = load_program(buckets[name]).run(x)
        got = prog.run(x, function_name=name)
        np.testing.assert_array_equal(got["y"], want["y"])


def test_bundle_failures_leave_nothing(buckets, tmp_path, monkeypatch):
    out = tmp_path / "b.mlpackage"
    with pytest.raises(BundleError, match="default function"):
        bundle_packages(buckets, out, default_function="t99")
    with pytest.raises(BundleError, match="not an identifier.*b3s"):
        bundle_packages({"3s": buckets["t16"]}, out, default_function="3s")
    assert function_name("3s") == "b3s" and function_name("t32") == "t32"
    with pytest.raises(BundleError, match="not an .mlpackage"):
        bundle_packages({"a": tmp_path / "nope.mlpackage"}, out, default_function="a")

    import coremltools as ct

    def broken(desc, path):  # writes something, then fails half-way
        (tmp_path / "marker").write_text("x")
        import os
        os.makedirs(path)
        (__import__("pathlib").Path(path) / "junk").write_text("partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(ct.utils, "save_multifunction", broken)
    with pytest.raises(BundleError, match=r"failed to bundle \['t16', 't40'\] into b.mlpackage: RuntimeError: disk full"):
        bundle_packages(buckets, out, default_function="t16")
    assert (tmp_path / "marker").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["marker"]


def test_bundling_validates_the_merged_program_once_and_an_invalid_one_fails(buckets, tmp_path, monkeypatch):
    """save_multifunction runs no graph pass yet validates after each of them (108 times for Kokoro's
    generator); bundling validates the merged program once, and a program that fails it leaves no bundle."""
    from coremltools.converters.mil.mil.program import Program

    validate, calls = Program.validate, []
    monkeypatch.setattr(Program, "validate", lambda self, check_essential_scope=False: (calls.append(self),
                                                                                          validate(self))[1])
    bundle_packages(buckets, tmp_path / "ok.mlpackage", default_function="t16")
    assert len(calls) == 1 and set(calls[0].functions) == set(buckets)

    def invalid(self, check_essential_scope=False):
        raise ValueError("var %x is not visible in block")

    monkeypatch.setattr(Program, "validate", invalid)
    with pytest.raises(BundleError, match="bad.mlpackage: ValueError: var %x is not visible"):
        bundle_packages(buckets, tmp_path / "bad.mlpackage", default_function="t16")
    assert not (tmp_path / "bad.mlpackage").exists()


def test_program_text_is_rendered_only_for_debug_logging():
    """coremltools formats the whole program into debug log lines at any log level; inside
    program_text_skipped it renders as one line unless coremltools' logger is at DEBUG."""
    import logging

    from coremltools.converters.mil import Builder as mb

    from anetts.compile.pipeline_trims import program_text_skipped

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 4))])
    def prog(x):
        return mb.relu(x=x, name="y")

    full = str(prog)
    assert "relu" in full
    with program_text_skipped():
        assert str(prog) == "<MIL program main: text not rendered, coremltools' logger is not at DEBUG>"
    assert str(prog) == full  # restored on exit
    logger = logging.getLogger("coremltools")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        with program_text_skipped():
            assert str(prog) == full
    finally:
        logger.setLevel(level)


class Lookup(nn.Module):
    """An embedding: a gather on run-time indices."""

    def __init__(self):
        super().__init__()
        self.e = nn.Embedding(10, 8)

    def forward(self, ids):
        return self.e(ids)


def test_a_bundle_function_is_its_package_again(bundle, buckets, tmp_path, convert_module, load_program):
    """A bundle re-serialises each macOS13 (iOS16 opset) package at iOS18: the same ops on the same
    values, which `function_difference` holds it to, or names what differs."""
    from anetts.mil.compare import function_difference, package_function
    from anetts.mil.errors import MilLoadError

    out, _ = bundle
    prog = load_program(out)
    assert function_difference(prog, "t16", package_function(buckets["t16"])) is None
    assert function_difference(prog, "t40", package_function(buckets["t40"])) is None
    assert "inputs" in function_difference(prog, "t16", package_function(buckets["t40"]))
    torch.manual_seed(1)  # the same layers with other weights
    other = tmp_path / "other.mlpackage"
    convert_module(Tiny().eval(), {"x": torch.randn(1, 96, 16)}, other)
    assert "holds another value" in function_difference(prog, "t16", package_function(other))
    with pytest.raises(MilLoadError, match="no such package"):
        package_function(tmp_path / "missing.mlpackage")
    # iOS17's gather takes validate_indices: the bundle gives the iOS16 op one, so it is not the same op
    lookup = tmp_path / "lookup.mlpackage"
    convert_module(Lookup().eval(), {"ids": torch.zeros(1, 5, dtype=torch.int32)}, lookup)
    bundle_packages({"t5": lookup}, tmp_path / "lookups.mlpackage", default_function="t5")
    why = function_difference(load_program(tmp_path / "lookups.mlpackage"), "t5", package_function(lookup))
    assert why.startswith("gather op") and "validate_indices" in why
