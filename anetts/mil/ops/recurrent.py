"""lstm and rnn (MIL ``iOS15/recurrent.py``; iOS17 adds fp16).

MIL's lstm, as pinned down by coremltools' own reference tests
(``mil/ops/tests/iOS14/test_recurrent.py``):

* ``x`` is ``[seq, batch, input]``; gates are stacked ``[i, f, o, z]`` (torch uses
  ``[i, f, z(g), o]``); ``bias`` is the sum of torch's ``b_ih + b_hh``.
* ``peephole`` ``[p_i, p_f, p_o]``: i and f see ``c_{t-1}``, o sees the new ``c_t``.
* ``clip``: the new cell state ``c_t`` is clipped to ``[-clip, clip]`` before o/h use it.
* activations: sigmoid, tanh, relu, linear, hard_sigmoid (``clip(0.2x+0.5, 0, 1)``),
  scaled_tanh (with its default alpha=beta=1, i.e. tanh).
* ``direction="reverse"``: the sequence is processed from the last step to the first
  and the *output sequence is in processing order* (output[0] belongs to x[-1]) --
  unlike the backward half of a bidirectional lstm, which is aligned with the input.
* ``bidirectional``: output is ``concat(fwd, bwd)`` along the last axis with bwd
  aligned to input positions; ``initial_h/c`` and the final states are ``[b, 2H]``
  (forward half first).  ``output_sequence=False`` returns, per direction, the final
  state (forward: after x[-1]; backward: after x[0]).

The recurrence runs in fp32 (the state is carried in fp32 inside the op, as fp16
hardware kernels keep their accumulators); outputs are rounded to the declared dtype.
With default activations and no peephole/clip it uses torch's fused LSTM kernel; other
configurations use a per-step loop.
"""
from __future__ import annotations

import torch

from ..registry import Kernel, Node, Unsupported, register
from ._util import F32, widen

_ACTS = {
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "scaled_tanh": torch.tanh,  # alpha = beta = 1 (the op has no way to pass others)
    "relu": torch.relu,
    "linear": lambda x: x,
    "hard_sigmoid": lambda x: torch.clamp(0.2 * x + 0.5, 0.0, 1.0),
}


def _act(node: Node, name: str, default: str):
    a = node.str(name, default) if node.has(name) else default
    key = a.lower()
    if key not in _ACTS:
        raise Unsupported(f"{name}={a!r}")
    return key


def _f32(node: Node, name: str):
    return node.tensor(name, F32) if node.has(name) else None


def _ifoz_to_ifgo(w: torch.Tensor) -> torch.Tensor:
    i, f, o, z = torch.chunk(w, 4, dim=0)
    return torch.cat([i, f, z, o], dim=0).contiguous()


class _Dir:
    """Weights of one direction, in MIL layout (and torch layout for the fused path)."""

    def __init__(self, w_ih, w_hh, b, p):
        self.w_ih, self.w_hh = w_ih, w_hh
        self.b = torch.zeros(w_ih.shape[0], dtype=F32) if b is None else b.reshape(-1)
        self.p = p
        self.torch_params = [_ifoz_to_ifgo(w_ih), _ifoz_to_ifgo(w_hh), _ifoz_to_ifgo(self.b), torch.zeros_like(self.b)]


def _loop(x, h, c, d: _Dir, acts, clip, reverse: bool):
    """Per-step reference loop (x: [s, b, I] fp32).  Returns outputs in processing order."""
    ra, ca, aa = (_ACTS[a] for a in acts)
    H = h.shape[-1]
    xw = torch.matmul(x, d.w_ih.t()) + d.b  # [s, b, 4H]
    steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    outs = []
    for t in steps:
        g = xw[t] + torch.matmul(h, d.w_hh.t())
        gi, gf, go, gz = g[:, :H], g[:, H : 2 * H], g[:, 2 * H : 3 * H], g[:, 3 * H :]
        if d.p is not None:
            gi = gi + c * d.p[:H]
            gf = gf + c * d.p[H : 2 * H]
        i, f, z = ra(gi), ra(gf), ca(gz)
        c = f * c + i * z
        if clip is not None:
            c = torch.clamp(c, -clip, clip)
        if d.p is not None:
            go = go + c * d.p[2 * H :]
        h = ra(go) * aa(c)
        outs.append(h)
    return torch.stack(outs, 0), h, c


def _fused(x, h, c, d: _Dir):
    """torch's LSTM kernel (same math as _loop with default activations)."""
    out, hn, cn = torch.lstm(x, (h.unsqueeze(0), c.unsqueeze(0)), d.torch_params, True, 1, 0.0, False, False, False)
    return out, hn[0], cn[0]


def _run_dir(x, h, c, d: _Dir, acts, clip, reverse: bool, fused: bool):
    if fused:
        if reverse:
            out, hn, cn = _fused(torch.flip(x, [0]), h, c, d)
            return out, hn, cn  # processing order
        return _fused(x, h, c, d)
    return _loop(x, h, c, d, acts, clip, reverse)


@register("lstm")
def _lstm(node: Node) -> Kernel:
    direction = node.str("direction", "forward") if node.has("direction") else "forward"
    if direction not in ("forward", "reverse", "bidirectional"):
        raise Unsupported(f"direction={direction!r}")
    out_seq = node.bool("output_sequence", False) if node.has("output_sequence") else False
    acts = (
        _act(node, "recurrent_activation", "sigmoid"),
        _act(node, "cell_activation", "tanh"),
        _act(node, "activation", "tanh"),
    )
    clip = node.float("clip") if node.has("clip") else None
    for p in ("weight_ih", "weight_hh", "bias", "peephole", "weight_ih_back", "weight_hh_back", "bias_back", "peephole_back"):
        if node.has(p) and not node.is_const(p):
            raise Unsupported(f"non-constant {p}")
    fwd = _Dir(_f32(node, "weight_ih"), _f32(node, "weight_hh"), _f32(node, "bias"), _f32(node, "peephole"))
    bwd = None
    if direction == "bidirectional":
        if not (node.has("weight_ih_back") and node.has("weight_hh_back")):
            raise Unsupported("bidirectional lstm without weight_ih_back/weight_hh_back")
        bwd = _Dir(
            _f32(node, "weight_ih_back"), _f32(node, "weight_hh_back"), _f32(node, "bias_back"), _f32(node, "peephole_back")
        )
    fused = acts == ("sigmoid", "tanh", "tanh") and clip is None and fwd.p is None and (bwd is None or bwd.p is None)
    H = fwd.w_hh.shape[1]
    od = [node.torch_dtype(t.dtype) for t in node.out_types]

    def run(x, h0, c0):
        xf, hf, cf = widen(x).to(F32), widen(h0).to(F32), widen(c0).to(F32)
        if bwd is None:
            out, hn, cn = _run_dir(xf, hf, cf, fwd, acts, clip, direction == "reverse", fused)
            if not out_seq:
                out = out[-1:]
        else:
            of, hnf, cnf = _run_dir(xf, hf[:, :H], cf[:, :H], fwd, acts, clip, False, fused)
            ob, hnb, cnb = _run_dir(xf, hf[:, H:], cf[:, H:], bwd, acts, clip, True, fused)
            if out_seq:
                out = torch.cat([of, torch.flip(ob, [0])], dim=-1)
            else:
                out = torch.cat([of[-1:], ob[-1:]], dim=-1)
            hn, cn = torch.cat([hnf, hnb], -1), torch.cat([cnf, cnb], -1)
        return out.to(od[0]), hn.to(od[1]), cn.to(od[2])

    return Kernel(run, ["x", "initial_h", "initial_c"])


@register("rnn")
def _rnn(node: Node) -> Kernel:
    direction = node.str("direction", "forward") if node.has("direction") else "forward"
    if direction not in ("forward", "reverse"):
        raise Unsupported(f"direction={direction!r}")
    out_seq = node.bool("output_sequence", False) if node.has("output_sequence") else False
    act = _ACTS[_act(node, "activation", "tanh")]
    w_ih, w_hh = _f32(node, "weight_ih"), _f32(node, "weight_hh")
    b = _f32(node, "bias")
    b = torch.zeros(w_ih.shape[0], dtype=F32) if b is None else b
    od = [node.torch_dtype(t.dtype) for t in node.out_types]

    def run(x, h0):
        xf, h = widen(x).to(F32), widen(h0).to(F32)
        xw = torch.matmul(xf, w_ih.t()) + b
        steps = range(xf.shape[0] - 1, -1, -1) if direction == "reverse" else range(xf.shape[0])
        outs = []
        for t in steps:
            h = act(xw[t] + torch.matmul(h, w_hh.t()))
            outs.append(h)
        out = torch.stack(outs, 0)
        if not out_seq:
            out = out[-1:]
        return out.to(od[0]), h.to(od[1])

    return Kernel(run, ["x", "initial_h"])

