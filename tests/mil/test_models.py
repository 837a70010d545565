"""Whole models: torch module -> ct.convert -> .mlpackage -> executor vs torch eager.

fp32 programs must match torch fp32 tightly; fp16 programs must keep SNR > 40 dB.
Each model is small so the conversions stay fast.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import coremltools as ct

from anetts.mil import load_program
from miltest import snr_db

PRECISIONS = [
    pytest.param(ct.precision.FLOAT32, ct.target.macOS15, id="fp32-macOS15"),
    pytest.param(ct.precision.FLOAT16, ct.target.macOS13, id="fp16-macOS13"),
    pytest.param(ct.precision.FLOAT16, ct.target.macOS15, id="fp16-macOS15"),
]


def _strip_weight_norm(m: nn.Module) -> nn.Module:
    for mod in m.modules():
        try:
            torch.nn.utils.remove_weight_norm(mod)
        except (ValueError, AttributeError):
            pass
    return m


def _convert_and_compare(module, example: dict, tmp_path, precision, target, min_snr=40.0):
    module = _strip_weight_norm(module.eval())
    args = tuple(torch.from_numpy(v) for v in example.values())
    with torch.no_grad():
        ref = module(*args)
        traced = torch.jit.trace(module, args)
    ref = ref if isinstance(ref, tuple) else (ref,)
    inputs = [ct.TensorType(name=n, shape=v.shape, dtype=v.dtype.type) for n, v in example.items()]
    ml = ct.convert(traced, convert_to="mlprogram", inputs=inputs, compute_precision=precision,
                    minimum_deployment_target=target)
    path = tmp_path / "model.mlpackage"
    ml.save(str(path))
    prog = load_program(path)
    outs = list(prog.run(example).values())
    assert len(outs) == len(ref)
    for got, want in zip(outs, ref):
        want = want.numpy()
        assert got.shape == want.shape
        if want.dtype.kind in "iu":
            np.testing.assert_array_equal(got, want)
            continue
        if precision == ct.precision.FLOAT32:
            assert got.dtype == np.float32
            scale = max(1.0, float(np.abs(want).max()))
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale)
        else:
            assert snr_db(want, got) > min_snr, snr_db(want, got)
    return prog


class ConvStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.utils.weight_norm(nn.Conv1d(8, 16, 5, padding=2))
        self.c2 = nn.Conv1d(16, 16, 3, dilation=3, padding=3, groups=4)
        self.c3 = nn.Conv1d(16, 8, 7, stride=2, padding=3)
        self.up = nn.ConvTranspose1d(8, 4, 20, 10, padding=5)
        self.dw = nn.ConvTranspose1d(4, 4, 3, 2, padding=1, output_padding=1, groups=4)
        self.pad = nn.ReflectionPad1d((1, 0))

    def forward(self, x):
        x = F.leaky_relu(self.c1(x), 0.2)
        x = x + 1 / 0.7 * torch.sin(0.7 * self.c2(x)) ** 2
        x = torch.tanh(self.c3(x))
        x = self.dw(self.up(x))
        return self.pad(F.interpolate(x, scale_factor=2, mode="nearest") + torch.repeat_interleave(x, 2, dim=-1))


class LstmStack(nn.Module):
    """A bidirectional nn.LSTM and the pipeline's replacement for packed sequences:
    two unidirectional LSTMs, the backward one on a length-aware reversed input."""

    def __init__(self):
        super().__init__()
        self.bi = nn.LSTM(12, 8, batch_first=True, bidirectional=True)
        self.fwd = nn.LSTM(16, 6, batch_first=True)
        self.bwd = nn.LSTM(16, 6, batch_first=True)
        self.proj = nn.Linear(12, 3)

    def forward(self, x, length):
        y, _ = self.bi(x)
        t = torch.arange(x.shape[1])
        idx = torch.where(t < length, length - 1 - t, t)
        yf, _ = self.fwd(y)
        yb, _ = self.bwd(torch.index_select(y, 1, idx))
        yb = torch.gather(yb, 1, idx.view(1, -1, 1).expand(y.shape[0], -1, yb.shape[-1]))
        z = self.proj(torch.cat([yf, yb], -1))
        dur = torch.round(torch.sigmoid(z).sum(-1) * 4).clamp(min=1).int()
        return z, dur


class LnLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 16)
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, ids, mask):
        h = self.ln(self.emb(ids))
        h = F.gelu(self.fc(h))
        att = torch.softmax(h @ h.transpose(1, 2) / 4.0 + (1 - mask[:, None, :]) * -1e4, -1)
        return self.fc2(att @ h).transpose(1, 2).cumsum(-1)


def _adain_blocks():
    from kokoro.istftnet import AdaINResBlock1, AdainResBlk1d

    class Blk(AdainResBlk1d):
        def forward(self, x, s):  # upstream's rsqrt(torch.tensor(2)) is int and does not convert
            return (self._residual(x, s) + self._shortcut(x)) * (2.0 ** -0.5)

    class Adain(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.b1 = Blk(16, 8, style_dim=12, upsample=True)
            self.b2 = AdaINResBlock1(8, 3, (1, 3, 5), style_dim=12)

        def forward(self, x, s):
            return self.b2(self.b1(x, s), s)

    return Adain()


def _albert():
    from transformers import AlbertConfig, AlbertModel

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            cfg = AlbertConfig(vocab_size=30, embedding_size=16, hidden_size=32, num_attention_heads=2,
                               intermediate_size=48, num_hidden_layers=2, max_position_embeddings=16)
            self.bert = AlbertModel(cfg).eval()
            self.enc = nn.Linear(32, 24)

        def forward(self, ids, mask):
            return self.enc(self.bert(ids, attention_mask=mask).last_hidden_state).transpose(-1, -2)

    return Bert()


class StftTransform(nn.Module):
    """kokoro's CustomSTFT.transform: conv STFT, magnitude, atan2 phase with the
    ``phase[mask] = pi`` fix-up (non_zero + scatter_nd after conversion)."""

    def __init__(self):
        super().__init__()
        from kokoro.custom_stft import CustomSTFT

        self.stft = CustomSTFT(filter_length=20, hop_length=5, win_length=20)

    def forward(self, wave):
        mag, phase = self.stft.transform(wave)
        return mag, torch.cos(phase), torch.sin(phase)  # wrap-free view of the phase


@pytest.mark.parametrize("precision,target", PRECISIONS)
def test_albert_with_attention_mask(tmp_path, precision, target):
    ids = np.random.default_rng(4).integers(0, 30, (1, 12)).astype(np.int32)
    mask = np.ones((1, 12), np.int32)
    mask[:, 9:] = 0
    prog = _convert_and_compare(_albert(), {"ids": ids, "mask": mask}, tmp_path, precision, target)
    assert "gelu" in prog.op_types()


@pytest.mark.parametrize("precision,target", PRECISIONS)
def test_kokoro_stft_transform(tmp_path, precision, target):
    wave = (np.random.default_rng(5).standard_normal((1, 400)) * 0.3).astype(np.float32)
    _convert_and_compare(StftTransform(), {"wave": wave}, tmp_path, precision, target)


@pytest.mark.parametrize("precision,target", PRECISIONS)
def test_conv_stack(tmp_path, precision, target):
    torch.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((1, 8, 24)).astype(np.float32)
    _convert_and_compare(ConvStack(), {"x": x}, tmp_path, precision, target)


@pytest.mark.parametrize("precision,target", PRECISIONS)
def test_lstm_stack(tmp_path, precision, target):
    torch.manual_seed(0)
    x = np.random.default_rng(1).standard_normal((1, 10, 12)).astype(np.float32)
    prog = _convert_and_compare(LstmStack(), {"x": x, "length": np.array([7], np.int32)}, tmp_path, precision, target)
    assert "lstm" in prog.op_types()


@pytest.mark.parametrize("precision,target", PRECISIONS)
def test_layernorm_linear_attention(tmp_path, precision, target):
    torch.manual_seed(0)
    ids = np.random.default_rng(2).integers(0, 20, (1, 9)).astype(np.int32)
    mask = np.ones((1, 9), np.float32)
    mask[:, 7:] = 0
    _convert_and_compare(LnLinear(), {"ids": ids, "mask": mask}, tmp_path, precision, target)


@pytest.mark.parametrize("precision,target", PRECISIONS)
def test_kokoro_adain_resblocks(tmp_path, precision, target):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 16, 20)).astype(np.float32)
    s = rng.standard_normal((1, 12)).astype(np.float32)
    prog = _convert_and_compare(_adain_blocks(), {"x": x, "s": s}, tmp_path, precision, target)
    ops = prog.op_types()
    assert {"instance_norm", "conv_transpose", "conv"} <= set(ops)
