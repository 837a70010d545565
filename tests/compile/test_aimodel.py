"""Core AI target: export folder → `.aimodel` → Apple's Linux runtime → the parity gate.

A two-layer masked module stands in for a stage (the Kokoro stages take minutes in Apple's runtime
at fp16); it goes through the project's own export step (`anetts.compile.export.export_stage`), so
the asset is built from a real export folder.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from anetts.compile.aimodel import AIModelError, asset_io, convert_module, convert_stage, run_asset
from anetts.compile.export import export_stage
from anetts.gate import ParityError
from anetts.options import Gate
from anetts.stage import Family, OneCallStage
from anetts.tensors import MAIN_FUNCTION, FunctionSpec, TensorSpec
from anetts.verify.aimodel_parity import run_aimodel_parity
from anetts.verify.parity import check_parity, one_call

T, VALID = 48, 40
META = {"model": "tiny-probe", "family": "kokoro", "source": "synthetic", "revision": "seed0",
        "licence": "Apache-2.0 (Kokoro-82M weights by hexgrad)"}


class Tiny(torch.nn.Module):
    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.conv = torch.nn.Conv1d(6, 16, 5, padding=2)
        self.proj = torch.nn.Linear(16, 8)

    def forward(self, x, mask):
        h = torch.tanh(self.conv(x * mask)) * mask
        y = self.proj(h.transpose(1, 2)).transpose(1, 2) * mask
        return y, h.sum(dim=1, keepdim=True)


class TinyStage(OneCallStage):
    name = "tiny"
    description = "conv + linear with a validity mask"

    def bucket_name(self, size):
        return f"t{size}"

    def geometry(self, size):
        return {"frames": size}

    def function(self, size):
        return FunctionSpec(MAIN_FUNCTION,
                            (TensorSpec("x", (1, 6, size), "float32", "features"),
                             TensorSpec("mask", (1, 1, size), "float32", "1 on valid frames")),
                            (TensorSpec("y", (1, 8, size), "float32", "projection"),
                             TensorSpec("energy", (1, 1, size), "float32", "channel sum")))

    def load(self, weights_dir, size):
        raise AssertionError("the tests pass the model")

    def build(self, model):
        return model

    def example_inputs(self, model, weights_dir, size, reference=None):
        rng = np.random.default_rng(1)
        mask = np.zeros((1, 1, size), np.float32)
        mask[..., :VALID] = 1
        return {"x": rng.standard_normal((1, 6, size)).astype(np.float32), "mask": mask}

    def valid_regions(self, inputs):
        n = int(inputs["mask"].sum())
        return {"y": (2, n), "energy": (2, n)}


def tiny_family(model) -> Family:
    return Family(name="tiny", stages={"tiny": TinyStage()}, load_reference_model=lambda _: model, weights_files=(),
                  synthesize=None, validate_weights=None)


@pytest.fixture(scope="module")
def export_folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    base = d / "t48"
    paths = {k: Path(f"{base}{suffix}") for k, suffix in
             (("functions", ".functions"), ("scenario", ".scenario.npz"), ("json", ".export.json"))}
    model = Tiny().eval()
    export_stage(tiny_family(model), "tiny", "t48", T, None, d, None, paths["functions"], paths["scenario"], paths["json"],
                 model=model)
    return model, paths


@pytest.mark.parametrize("precision,min_db", [("fp32", 100.0), ("fp16", 50.0)])
def test_export_folder_to_gated_asset(export_folder, tmp_path, precision, min_db):
    model, p = export_folder
    family = tiny_family(model)
    asset, report_path = tmp_path / "aimodels" / "t48.aimodel", tmp_path / "aimodels" / "t48.json"
    report = convert_stage(family, "tiny", T, tmp_path, p["scenario"], p["json"], asset, report_path,
                           precision, META, model=model)
    assert asset.is_dir() and json.loads(report_path.read_text())["sha256"] == report["sha256"]
    io_dtype = "float16" if precision == "fp16" else "float32"
    assert report["function"] == "t48" and report["precision"] == precision
    assert [(t["name"], t["shape"], t["dtype"]) for t in report["inputs"]] == [("x", [1, 6, T], io_dtype), ("mask", [1, 1, T], io_dtype)]
    assert report["n_ops"] > 0
    meta = json.loads((asset / "metadata.json").read_text())
    assert meta["author"] == "ane-tts" and meta["license"].startswith("Apache-2.0")
    assert meta["creatorDefinedMetadata"]["anetts.precision"] == precision

    parity = run_aimodel_parity(asset, p["scenario"], p["json"], Gate(), asset_report=report_path)
    out_json = tmp_path / "parity" / "t48.json"
    check_parity(parity, out_json, out_json.with_suffix(".outputs.npz"))
    coreai = json.loads(out_json.read_text())["backends"]["coreai"]
    assert coreai["passed"] and coreai["precision"] == precision
    assert coreai["min_snr_db"] >= min_db, coreai
    with np.load(out_json.with_suffix(".outputs.npz")) as z:
        assert z["coreai/y"].shape == (1, 8, VALID)  # the valid region only


def test_perturbed_model_fails_the_gate(export_folder, tmp_path):
    model, p = export_folder
    bad = Tiny().eval()
    with torch.no_grad():
        bad.proj.weight.mul_(1.3)  # ~10 dB: far below the 35 dB gate
    spec = TinyStage().function(T)
    inputs = dict(one_call(p["scenario"]).inputs)
    asset = tmp_path / "t48.aimodel"
    convert_module(bad, inputs, spec, "tiny", "t48", {"frames": T}, asset, tmp_path / "t48.json", "fp32", META)
    parity = run_aimodel_parity(asset, p["scenario"], p["json"], Gate())
    out_json = tmp_path / "parity" / "t48.json"
    out_json.parent.mkdir()  # Snakemake creates output folders before a job runs
    with pytest.raises(ParityError, match="tiny/t48 failed its parity gate"):
        check_parity(parity, out_json, out_json.with_suffix(".outputs.npz"))
    assert not out_json.exists() and not out_json.with_suffix(".outputs.npz").exists()
    failed = json.loads((tmp_path / "parity" / "t48.failed.json").read_text())
    assert failed["backends"]["coreai"]["min_snr_db"] < 35

    # the same perturbation caught earlier: the export folder no longer matches the model
    with pytest.raises(AIModelError, match="rebuilt wrapper's y differs from the export's eager output"):
        convert_stage(tiny_family(bad), "tiny", T, tmp_path, p["scenario"], p["json"],
                      tmp_path / "x.aimodel", tmp_path / "x.json", "fp32", META, model=bad)
    assert not (tmp_path / "x.aimodel").exists() and not (tmp_path / "x.json").exists()


def test_bad_inputs_are_named(export_folder, tmp_path):
    model, p = export_folder
    spec = TinyStage().function(T)
    inputs = dict(one_call(p["scenario"]).inputs)
    where = ("tiny", "t48", {"frames": T})
    with pytest.raises(AIModelError, match="unknown precision 'int4'"):
        convert_module(model, inputs, spec, *where, tmp_path / "a.aimodel", tmp_path / "a.json", "int4", META)
    assert not (tmp_path / "a.aimodel").exists() and not (tmp_path / "a.json").exists()
    with pytest.raises(AIModelError, match="example inputs lack input: mask"):
        convert_module(model, {"x": inputs["x"]}, spec, *where, tmp_path / "a.aimodel", tmp_path / "a.json", "fp16", META)
    with pytest.raises(ValueError, match="for input: x"):
        convert_module(model, {**inputs, "x": inputs["x"][..., :10]}, spec, *where, tmp_path / "a.aimodel",
                       tmp_path / "a.json", "fp16", META)

    asset = tmp_path / "ok.aimodel"
    convert_module(model, inputs, spec, *where, asset, tmp_path / "ok.json", "fp16", META)
    assert list(asset_io(asset)["functions"]) == ["t48"]
    with pytest.raises(AIModelError, match="missing input: mask"):
        run_asset(asset, {"x": inputs["x"]})
    with pytest.raises(AIModelError, match=r"expected shape \(1, 1, 48\), got \(1, 1, 12\) for input: mask"):
        run_asset(asset, {**inputs, "mask": inputs["mask"][..., :12]})
    with pytest.raises(AIModelError, match="expected a float16 array, got int32 for input: x"):
        run_asset(asset, {**inputs, "x": inputs["x"].astype(np.int32)})
    with pytest.raises(AIModelError, match=r"unknown inputs \['speed'\]"):
        run_asset(asset, {**inputs, "speed": np.ones(1, np.float32)})
    with pytest.raises(AIModelError, match="no function 'b3s'"):
        run_asset(asset, inputs, "b3s")
    with pytest.raises(AIModelError, match="not a Core AI asset"):
        run_asset(tmp_path / "missing.aimodel", inputs)


def test_apple_runtime_accumulates_linear_in_fp16(tmp_path):
    """docs/coreai.md's explanation of the fp16 gap, pinned: Apple's fp16 `linear` is bit-exact with a
    sequential fp16 accumulator; the MIL executor's policy (fp32 accumulation) is ~12 dB closer to fp64."""
    from fp16_compare import _Op, aimodel_fp16, fp16_accumulate_linear, torch_fp16_decomposed_fp16acc

    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 96, generator=g) * 96 ** -0.5
    x = torch.randn(1, 8, 96, generator=g).half().float()
    op = _Op(lambda m, x: torch.nn.functional.linear(x, m.w), {"w": w}).eval()
    spec = FunctionSpec("probe", (TensorSpec("x", (1, 8, 96), "float32", ""),), (TensorSpec("y", (1, 8, 16), "float32", ""),))
    (apple,) = aimodel_fp16(op, (x,), spec, tmp_path)
    model = fp16_accumulate_linear(x.numpy(), w.numpy())
    np.testing.assert_array_equal(apple, model)
    np.testing.assert_array_equal(torch_fp16_decomposed_fp16acc(op, (x,))[0].numpy(), model)
    exact = (x.double() @ w.half().double().T).numpy()
    fp32_acc = (x @ w.half().float().T).half().float().numpy()
    err = lambda y: float(np.sum((y - exact) ** 2))
    assert err(model) > 4 * err(fp32_acc)
