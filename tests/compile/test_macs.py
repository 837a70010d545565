"""Multiply-accumulates per op (anetts.compile.macs) and in `anetts inspect`, against hand arithmetic
on tiny converted programs."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn

from anetts.compile.inspect import inspect_package, load_spec, main
from anetts.compile.macs import function_macs


class Toy(nn.Module):
    """One of each counted op torch gives: conv (plain, grouped), conv_transpose, linear, a
    bidirectional LSTM, matmul and an einsum (which coremltools lowers to a matmul)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(8, 16, 3, padding=1)
        self.gconv = nn.Conv1d(16, 16, 5, padding=2, groups=4)
        self.up = nn.ConvTranspose1d(16, 4, 4, stride=2, padding=1)
        self.lin = nn.Linear(40, 12)
        self.lstm = nn.LSTM(12, 6, batch_first=True, bidirectional=True)

    def forward(self, x, a, b):
        u = self.up(self.gconv(self.conv(x)))  # (1, 8, 20) -> (1, 16, 20) -> (1, 16, 20) -> (1, 4, 40)
        y, _ = self.lstm(self.lin(u))  # (1, 4, 12) -> (1, 4, 12)
        return y, torch.matmul(a, b), torch.einsum("bij,bkj->bik", a, a)


# by hand: output elements x what each one contracts over
HAND = {
    "conv": 16 * 20 * (8 * 3) + 16 * 20 * (16 // 4 * 5),  # 7680 + 6400
    "conv_transpose": 16 * 20 * (4 * 4),  # every input element meets C_out x kernel weights: 5120
    "linear": 4 * 12 * 40,  # 1920
    "lstm": 4 * 1 * 2 * (4 * 6 * 12 + 4 * 6 * 6),  # steps x batch x directions x (W_ih + W_hh): 3456
    "matmul": 2 * 5 * 3 * 7 + 2 * 5 * 5 * 7,  # a @ b, then a @ a^T (the einsum): 210 + 350
}


@pytest.fixture(scope="module")
def toy(tmp_path_factory, convert_module):
    out = tmp_path_factory.mktemp("macs") / "toy.mlpackage"
    torch.manual_seed(0)
    convert_module(Toy(), {"x": torch.randn(1, 8, 20), "a": torch.randn(2, 5, 7), "b": torch.randn(2, 7, 3)}, out,
                   outputs=("y", "m", "e"))
    return out


def test_counts_match_hand_arithmetic(toy):
    spec = load_spec(toy)
    ops = {op.type for fn in spec.mlProgram.functions.values() for b in fn.block_specializations.values()
           for op in b.operations}
    assert set(HAND) <= ops  # the program still holds every op the count is checked on
    macs = function_macs(spec.mlProgram.functions["main"])
    assert macs["by_op"] == HAND
    assert macs["total"] == sum(HAND.values()) == 25136


def test_einsum_op_counts_every_index(tmp_path):
    """An `einsum` MIL op (coremltools saves its equation as a const input): n x c x h x w x u."""
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 3, 4, 5)), mb.TensorSpec(shape=(1, 5, 4, 6))],
                opset_version=ct.target.macOS13)
    def prog(a, b):
        return mb.einsum(values=(a, b), equation="nchw,nwhu->nchu")

    m = ct.convert(prog, convert_to="mlprogram", pass_pipeline=ct.PassPipeline.EMPTY,
                   minimum_deployment_target=ct.target.macOS13)
    m.save(str(tmp_path / "einsum.mlpackage"))
    macs = function_macs(load_spec(tmp_path / "einsum.mlpackage").mlProgram.functions["main"])
    assert macs == {"total": 1 * 3 * 4 * 5 * 6, "by_op": {"einsum": 360}}


def test_inspect_reports_macs_per_function_and_package(toy, tmp_path, capsys):
    info = inspect_package(toy)
    assert info["functions"]["main"]["macs"]["by_op"] == HAND
    assert info["macs"] == {"total": sum(HAND.values()), "by_op": dict(sorted(HAND.items()))}
    assert main([str(toy), "--json", str(tmp_path / "i.json")]) == 0
    text = capsys.readouterr().out
    # largest first, in SI units
    assert "    MACs: 25.1 k (conv 14.1 k, conv_transpose 5.12 k, lstm 3.46 k, linear 1.92 k, matmul 560)" in text
    saved = json.loads((tmp_path / "i.json").read_text())
    assert saved["macs"]["total"] == 25136 and saved["functions"]["main"]["macs"]["by_op"]["lstm"] == 3456
