"""Two saves of one model are byte-identical once stabilized, whatever day they were saved on."""
from __future__ import annotations

import json

import numpy as np

from anetts.artifacts import tree_sha256
from anetts.compile.inspect import package_files
from anetts.compile.reproducible import CONVERSION_DATE_KEY, item_identifier, stabilize_package


def tiny_program():
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 7

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 4))], opset_version=ct.target.macOS15)
    def prog(x):
        return mb.linear(x=x, weight=w, name="y")

    return ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.macOS15)


def saved(tmp_path, name, date):
    model = tiny_program()
    model.user_defined_metadata["anetts.stage"] = "demo"
    model.save(str(tmp_path / name))
    spec_file = package_files(tmp_path / name)[1]
    from coremltools.proto import Model_pb2

    spec = Model_pb2.Model()
    spec.ParseFromString(spec_file.read_bytes())
    assert CONVERSION_DATE_KEY in spec.description.metadata.userDefined  # coremltools writes it
    spec.description.metadata.userDefined[CONVERSION_DATE_KEY] = date  # as a save on that day would
    spec_file.write_bytes(spec.SerializeToString())
    return tmp_path / name


def test_saves_on_two_days_stabilize_to_the_same_bytes(tmp_path):
    a, b = saved(tmp_path, "a.mlpackage", "2026-12-01"), saved(tmp_path, "b.mlpackage", "2026-12-02")
    assert tree_sha256(a) != tree_sha256(b)
    for pkg in (a, b):
        stabilize_package(pkg)
    assert tree_sha256(a) == tree_sha256(b)
    from coremltools.proto import Model_pb2

    spec = Model_pb2.Model()
    spec.ParseFromString(package_files(a)[1].read_bytes())
    meta = dict(spec.description.metadata.userDefined)
    assert CONVERSION_DATE_KEY not in meta and meta["anetts.stage"] == "demo"  # only the date goes
    entries = json.loads((a / "Manifest.json").read_text())["itemInfoEntries"]
    assert {k: item_identifier(v["path"]) for k, v in entries.items()} == {k: k for k in entries}


def test_a_saved_conversion_drops_coremltools_temporary_package(tmp_path):
    """coremltools converts into a temporary package that it deletes only at interpreter exit; once
    the model is saved, `drop_temp_package` deletes it, and the saved package is whole."""
    from pathlib import Path

    from anetts.compile.convert import drop_temp_package
    from anetts.mil import load_program

    model = tiny_program()
    temp = Path(model.package_path)
    assert model.is_temp_package and temp.is_dir()
    model.save(str(tmp_path / "m.mlpackage"))
    drop_temp_package(model)
    assert not temp.exists()
    x = np.ones((2, 4), np.float32)
    got = load_program(tmp_path / "m.mlpackage").run({"x": x})["y"]
    np.testing.assert_allclose(got, x @ (np.arange(12, dtype=np.float32).reshape(3, 4) / 7).T, rtol=1e-2)
