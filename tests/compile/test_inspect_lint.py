"""inspect_package + static ANE lint (anetts.compile.inspect) on tiny converted modules."""
from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch
import torch.nn as nn

from anetts.compile.inspect import (RULES, LintError, apply_lint_policy, compute_plan, inspect_package, main)


class LstmGather(nn.Module):
    """Embedding lookup of runtime ids (dynamic gather) feeding an LSTM."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.lstm = nn.LSTM(16, 8, batch_first=True)

    def forward(self, ids):
        y, _ = self.lstm(self.emb(ids))
        return y


class Wide(nn.Module):
    """A > 16384 last axis."""

    def forward(self, x):
        return x * 2.0


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(8, 8, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))


@pytest.fixture(scope="module")
def pkgs(tmp_path_factory, convert_module):
    import coremltools as ct

    d = tmp_path_factory.mktemp("inspect")
    out = {k: d / f"{k}.mlpackage" for k in ("lstm", "wide", "flex", "plain")}
    torch.manual_seed(0)
    convert_module(LstmGather(), {"ids": torch.randint(0, 50, (1, 12), dtype=torch.int32)}, out["lstm"],
                   metadata={"anetts.stage": "toy", "anetts.precision": "fp16"})
    convert_module(Wide(), {"x": torch.randn(1, 16400)}, out["wide"])
    convert_module(Plain(), {"x": torch.randn(1, 8, 20)}, out["flex"],
                   shapes={"x": ct.Shape((1, 8, ct.RangeDim(4, 64, default=20)))})
    convert_module(Plain(), {"x": torch.randn(1, 8, 20)}, out["plain"])
    return out


def _rules(info):
    return {f["rule"] for f in info["lint"]}


def test_inspect_fields(pkgs):
    info = inspect_package(pkgs["lstm"])
    assert info["specification_version"] == 7 and info["deployment_target"] == "macOS13"
    assert info["metadata"]["user_defined"]["anetts.stage"] == "toy"
    assert info["default_function"] == "main"
    f = info["functions"]["main"]
    assert f["inputs"] == [{"name": "ids", "kind": "multiArrayType", "shape": [1, 12], "dtype": "int32"}]
    assert f["outputs"][0]["name"] == "y" and f["outputs"][0]["shape"] == [1, 12, 8]
    assert f["ops"]["lstm"] == 1 and f["ops"]["gather"] == 1 and f["op_count"] == sum(f["ops"].values())
    # weights: embedding 50x16 + LSTM (4*8*(16+8) + 2*4*8 biases, maybe fused) -- all in the blob file
    n_params = 50 * 16 + 4 * 8 * (16 + 8)
    assert f["weight_bytes_blob"] >= n_params * 2
    assert f["weight_bytes"] <= info["weight_files"]["weight.bin"] + f["weight_bytes_inline"]
    assert info["bytes"] > info["weight_files"]["weight.bin"]
    json.dumps(info)  # JSON-serialisable


def test_lint_lstm_gather(pkgs):
    info = inspect_package(pkgs["lstm"])
    rules = _rules(info)
    # at macOS13 (iOS16 opset) MIL lstm is fp32-only, so it stays fp32 in an fp16 program
    assert {"dynamic_gather", "ane_unfriendly_ops", "fp32_compute"} <= rules
    fp32 = next(f for f in info["lint"] if f["rule"] == "fp32_compute")
    assert fp32["op_types"] == {"lstm": 1}
    unfriendly = [f for f in info["lint"] if f["rule"] == "ane_unfriendly_ops"]
    assert any(f["op_type"] == "lstm" and f["count"] == 1 for f in unfriendly)
    for f in info["lint"]:
        assert set(f) >= {"rule", "severity", "message", "count", "reason", "source"}
        assert f["severity"] in ("info", "warn", "fatal") and f["reason"] and f["source"]
    assert "flexible_shapes" not in rules and "long_last_axis" not in rules


def test_lint_wide(pkgs):
    info = inspect_package(pkgs["wide"])
    by_rule = {f["rule"]: f for f in info["lint"]}
    assert by_rule["long_last_axis"]["max_width"] == 16400
    assert "16384" in by_rule["long_last_axis"]["reason"]
    assert "rank_gt_5" not in by_rule


def test_lint_rank_gt_5(pkgs, tmp_path):
    """coremltools refuses rank > 5 at conversion, so edit a saved program's types by hand."""
    from anetts.compile.inspect import load_spec, package_files

    pkg = tmp_path / "r6.mlpackage"
    shutil.copytree(pkgs["plain"], pkg)
    _, spec_file, _ = package_files(pkg)
    spec = load_spec(pkg)
    fn = spec.mlProgram.functions["main"]
    op = next(o for o in fn.block_specializations[fn.opset].operations if o.type == "relu")
    tt = op.outputs[0].type.tensorType
    del tt.dimensions[:]
    for d in (1, 2, 2, 2, 2, 20):
        tt.dimensions.add().constant.size = d
    tt.rank = 6
    spec_file.write_bytes(spec.SerializeToString())
    findings = inspect_package(pkg)["lint"]
    assert [f["count"] for f in findings if f["rule"] == "rank_gt_5"] == [1]


def test_plain_model_is_clean(pkgs):
    assert inspect_package(pkgs["plain"])["lint"] == []


def test_lint_flexible_shapes(pkgs):
    info = inspect_package(pkgs["flex"])
    f = info["functions"]["main"]["inputs"][0]
    assert f["flexible"] == {"range": [[1, 1], [8, 8], [4, 64]]}
    assert "flexible_shapes" in _rules(info)


def test_lint_policy(pkgs):
    findings = inspect_package(pkgs["flex"])["lint"]
    apply_lint_policy(findings, [])  # warnings only: passes
    apply_lint_policy(findings, ["dynamic_gather"])  # rule configured fatal but not firing
    with pytest.raises(LintError, match=r"flexible_shapes.*RangeDim"):
        apply_lint_policy(findings, ["flexible_shapes"])
    with pytest.raises(LintError, match="unknown lint rule"):
        apply_lint_policy(findings, ["flexible_shape"])
    with pytest.raises(LintError):
        apply_lint_policy([{**findings[0], "severity": "fatal"}], [])
    assert set(RULES) == {"flexible_shapes", "rank_gt_5", "fp32_compute", "ane_unfriendly_ops",
                          "long_last_axis", "dynamic_gather"}


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the non-macOS error path")
def test_compute_plan_needs_macos(pkgs):
    with pytest.raises(RuntimeError, match="MLComputePlan needs macOS"):
        compute_plan(pkgs["lstm"], "CPU_AND_NE")


def test_cli(pkgs, tmp_path, capsys):
    out = tmp_path / "r" / "lstm.json"
    assert main([str(pkgs["lstm"]), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "lstm" in printed and "dynamic_gather" in printed
    data = json.loads(out.read_text())
    assert data["functions"]["main"]["ops"]["lstm"] == 1
    assert main([str(pkgs["lstm"]), "--fatal", "dynamic_gather"]) == 2
    assert main([str(tmp_path / "missing.mlpackage")]) == 1
    if sys.platform != "darwin":
        assert main([str(pkgs["lstm"]), "--compute-plan", "CPU_AND_NE"]) == 1
