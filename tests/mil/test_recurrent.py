"""lstm / rnn vs torch.nn.LSTM and a numpy reference (the one coremltools' own tests use)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from coremltools.converters.mil.mil import Builder as mb

from miltest import assert_close, rng, run

R = rng(9)
S, B, I, H = 6, 2, 5, 4


def _ifzo_to_ifoz(w):
    i, f, z, o = np.split(w, 4)
    return np.concatenate([i, f, o, z])


def _torch_lstm(bidirectional=False, seed=0):
    torch.manual_seed(seed)
    return torch.nn.LSTM(I, H, bidirectional=bidirectional).eval()


def _mil_weights(lstm, suffix=""):
    sd = {k: v.detach().numpy() for k, v in lstm.state_dict().items()}
    w_ih = _ifzo_to_ifoz(sd[f"weight_ih_l0{suffix}"])
    w_hh = _ifzo_to_ifoz(sd[f"weight_hh_l0{suffix}"])
    b = _ifzo_to_ifoz(sd[f"bias_ih_l0{suffix}"] + sd[f"bias_hh_l0{suffix}"])
    return w_ih, w_hh, b


@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("output_sequence", [True, False])
def test_lstm_unidirectional_vs_torch(direction, output_sequence):
    lstm = _torch_lstm()
    w_ih, w_hh, b = _mil_weights(lstm)
    x = R.standard_normal((S, B, I)).astype(np.float32)
    h0 = R.standard_normal((B, H)).astype(np.float32)
    c0 = R.standard_normal((B, H)).astype(np.float32)
    got = run(lambda x, h, c: mb.lstm(x=x, initial_h=h, initial_c=c, weight_ih=w_ih, weight_hh=w_hh, bias=b,
                                      direction=direction, output_sequence=output_sequence),
              {"x": x, "h": h0, "c": c0})
    # coremltools' reference: "reverse" runs torch on the flipped sequence and does NOT
    # flip the output back (outputs are in processing order)
    xt = torch.from_numpy(x[::-1].copy() if direction == "reverse" else x)
    out, (hn, cn) = lstm(xt, (torch.from_numpy(h0)[None], torch.from_numpy(c0)[None]))
    out = out.detach().numpy()
    if not output_sequence:
        out = out[-1:]
    assert_close(got[0], out, rtol=1e-5, atol=1e-6)
    assert_close(got[1], hn[0].detach().numpy(), rtol=1e-5, atol=1e-6)
    assert_close(got[2], cn[0].detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("output_sequence", [True, False])
def test_lstm_bidirectional_vs_torch(output_sequence):
    lstm = _torch_lstm(bidirectional=True)
    wf, whf, bf = _mil_weights(lstm)
    wr, whr, br = _mil_weights(lstm, "_reverse")
    x = R.standard_normal((S, B, I)).astype(np.float32)
    h0 = R.standard_normal((2, B, H)).astype(np.float32)
    c0 = R.standard_normal((2, B, H)).astype(np.float32)
    got = run(lambda x, h, c: mb.lstm(x=x, initial_h=h, initial_c=c, weight_ih=wf, weight_hh=whf, bias=bf,
                                      weight_ih_back=wr, weight_hh_back=whr, bias_back=br, direction="bidirectional",
                                      output_sequence=output_sequence),
              {"x": x, "h": np.concatenate([h0[0], h0[1]], -1), "c": np.concatenate([c0[0], c0[1]], -1)})
    with torch.no_grad():
        out, (hn, cn) = lstm(torch.from_numpy(x), (torch.from_numpy(h0), torch.from_numpy(c0)))
    out = out.numpy()
    if not output_sequence:  # per direction, the state after its last step
        out = np.concatenate([out[-1:, :, :H], out[:1, :, H:]], -1)
    assert_close(got[0], out, rtol=1e-5, atol=1e-6)
    assert_close(got[1], np.concatenate([hn[0], hn[1]], -1), rtol=1e-5, atol=1e-6)
    assert_close(got[2], np.concatenate([cn[0], cn[1]], -1), rtol=1e-5, atol=1e-6)


def _act(x, name):
    if name in ("tanh", "scaled_tanh"):
        return np.tanh(x)
    if name == "relu":
        return np.maximum(0, x)
    if name == "sigmoid":
        return 1 / (1 + np.exp(-x))
    if name == "hard_sigmoid":
        return np.minimum(np.maximum(0.2 * x + 0.5, 0), 1)
    return x


def _np_lstm(x, h, c, w_x, w_h, b, p, acts, clip):
    """coremltools' numpy reference (mil/ops/tests/iOS14/test_recurrent.py), batched."""
    wi, wf, wo, wg = np.split(w_x, 4)
    ri, rf, ro, rg = np.split(w_h, 4)
    bi, bf, bo, bg = np.split(b, 4)
    pi, pf, po = np.split(p, 3)
    outs = []
    for t in range(x.shape[0]):
        xt = x[t]
        i = _act(xt @ wi.T + h @ ri.T + bi + c * pi, acts[0])
        f = _act(xt @ wf.T + h @ rf.T + bf + c * pf, acts[0])
        g = _act(xt @ wg.T + h @ rg.T + bg, acts[1])
        c = c * f + i * g
        if clip is not None:
            c = np.clip(c, -clip, clip)
        o = _act(xt @ wo.T + h @ ro.T + bo + c * po, acts[0])
        h = o * _act(c, acts[2])
        outs.append(h)
    return np.stack(outs), h, c


@pytest.mark.parametrize(
    "acts", [("sigmoid", "tanh", "tanh"), ("hard_sigmoid", "relu", "linear"), ("sigmoid", "scaled_tanh", "relu"),
             ("tanh", "sigmoid", "hard_sigmoid")]
)
@pytest.mark.parametrize("peephole,clip", [(False, None), (True, None), (True, 0.2), (False, 50.0)])
def test_lstm_activations_peephole_clip(acts, peephole, clip):
    w_x = (R.random((4 * H, I)) - 0.5).astype(np.float32)
    w_h = (R.random((4 * H, H)) - 0.5).astype(np.float32)
    b = (R.random(4 * H) - 0.5).astype(np.float32)
    p = (R.random(3 * H) - 0.5).astype(np.float32) if peephole else np.zeros(3 * H, np.float32)
    x = R.standard_normal((S, B, I)).astype(np.float32)
    h0 = np.zeros((B, H), np.float32)
    c0 = np.zeros((B, H), np.float32)
    kw = dict(peephole=p) if peephole else {}
    if clip is not None:
        kw["clip"] = np.float32(clip)
    got = run(lambda x: mb.lstm(x=x, initial_h=h0, initial_c=c0, weight_ih=w_x, weight_hh=w_h, bias=b,
                                recurrent_activation=acts[0], cell_activation=acts[1], activation=acts[2],
                                output_sequence=True, **kw), {"x": x})
    out, h, c = _np_lstm(x.astype(np.float64), h0, c0, w_x, w_h, b, p, acts, clip)
    assert_close(got[0], out, rtol=1e-5, atol=1e-5)
    assert_close(got[1], h, rtol=1e-5, atol=1e-5)
    assert_close(got[2], c, rtol=1e-5, atol=1e-5)


def test_lstm_fp16_ios17():
    """iOS17+ lstm may run in fp16 (what ct.convert emits for macOS14+/FLOAT16)."""
    lstm = _torch_lstm()
    w_ih, w_hh, b = (a.astype(np.float16) for a in _mil_weights(lstm))
    x = R.standard_normal((S, 1, I)).astype(np.float16)
    z = np.zeros((1, H), np.float16)
    got = run(lambda x: mb.lstm(x=x, initial_h=z, initial_c=z, weight_ih=w_ih, weight_hh=w_hh, bias=b,
                                output_sequence=True), {"x": x}, opset=17)
    assert all(g.dtype == np.float16 for g in got)
    out, _ = lstm(torch.from_numpy(x.astype(np.float32)))
    assert_close(got[0], out.detach().numpy(), rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_rnn(direction):
    w_ih = (R.random((H, I)) - 0.5).astype(np.float32)
    w_hh = (R.random((H, H)) - 0.5).astype(np.float32)
    b = (R.random(H) - 0.5).astype(np.float32)
    x = R.standard_normal((S, B, I)).astype(np.float32)
    h0 = R.standard_normal((B, H)).astype(np.float32)
    got = run(lambda x, h: mb.rnn(x=x, initial_h=h, weight_ih=w_ih, weight_hh=w_hh, bias=b, direction=direction,
                                  output_sequence=True), {"x": x, "h": h0})
    h = h0.astype(np.float64)
    outs = []
    for t in (range(S - 1, -1, -1) if direction == "reverse" else range(S)):
        h = np.tanh(x[t] @ w_ih.T + h @ w_hh.T + b)
        outs.append(h)
    assert_close(got[0], np.stack(outs), rtol=1e-5, atol=1e-6)
    assert_close(got[1], h, rtol=1e-5, atol=1e-6)
