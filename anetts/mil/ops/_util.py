"""Helpers shared by the op modules.

Precision policy (what "fp16-faithful" means here)
--------------------------------------------------
Values live in the dtype the program declares.  An op whose result is fp16 is computed
the way most fp16 hardware computes it: inputs are widened to fp32, the op runs in fp32
(accumulations included), and the result is rounded once to fp16 (round-to-nearest-even,
overflow to +-inf).  Basic arithmetic (add/sub/mul/div/min/max/compare) on fp16 tensors
runs directly on torch.float16, which on CPU is exactly that (widen, compute, round
once); the test-suite checks this bit-for-bit.

Other unary functions (sin, exp, tanh, ...) use torch's native half kernel only when a
one-time exhaustive check over all 65536 fp16 values shows it behaves like "fp32 then
round once" (results within 1 ulp of that, and differing for < 0.1% of inputs, i.e. only
where two fp32 implementations of the function round differently); otherwise (e.g.
torch's half erf and gelu kernels use lower-precision internals) they are explicitly
widened.  Ops with an epsilon or several roundings (rsqrt(x+eps), x*a+b) always widen.
This keeps fp16 programs fast without giving up the precision policy.
"""
from __future__ import annotations

import threading

import numpy as np
import torch

F16 = torch.float16
F32 = torch.float32
_WIDEN = (torch.float16, torch.bfloat16)


_ALL_F16: torch.Tensor | None = None
_HALF_OK: dict = {}


def _all_fp16() -> torch.Tensor:
    global _ALL_F16
    if _ALL_F16 is None:
        _ALL_F16 = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)
    return _ALL_F16


def half_native_ok(key, fn) -> bool:
    """Whether ``fn`` on float16 tensors matches fp32 evaluation + one rounding (see module doc)."""
    ok = _HALF_OK.get(key)
    if ok is None:
        x = _all_fp16()
        with torch.inference_mode():
            try:
                a = fn(x)
            except RuntimeError:  # no half kernel
                _HALF_OK[key] = False
                return False
            b = fn(x.float()).to(F16)
        if a.dtype != F16 or a.shape != b.shape:
            ok = False
        else:
            an, bn = a.isnan(), b.isnan()
            same = (a == b) | (an & bn)
            if bool((an != bn).any()) or bool(((a.isinf() | b.isinf()) & ~same).any()):
                ok = False
            else:
                diff = (a.float() - b.float()).abs()
                with np.errstate(invalid="ignore", over="ignore"):
                    ulp = torch.from_numpy(np.spacing(np.abs(b.numpy()))).float()
                bad = ~same
                ok = int(bad.sum()) < 0.001 * x.numel() and bool((diff[bad] <= ulp[bad]).all())
        _HALF_OK[key] = ok
    return ok


def fp16_aware(fn, out_dtype: torch.dtype, key):
    """Kernel for a unary float function: native half when :func:`half_native_ok`,
    otherwise computed in fp32 and rounded once."""
    if out_dtype == F16 and key is not None and half_native_ok(key, fn):

        def run_half(x):
            if x.dtype != F16:
                return fn(widen(x)).to(out_dtype)
            return fn(x)

        return run_half
    return in_fp32(fn, out_dtype)


def widen(t: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 -> fp32; other dtypes unchanged."""
    return t.float() if t.dtype in _WIDEN else t


# An fp16 weight is widened this many bytes of fp32 at a time, into one buffer per thread:
# allocating a whole widened weight at each call took 12x the product (page faults).
_BLOCK_BYTES = 2 * 2**20
_SCRATCH = threading.local()


def by_output_blocks(w: torch.Tensor, b: torch.Tensor | None, compute, axis: int) -> torch.Tensor:
    """``compute(w, b)`` in fp32 on an fp16 weight without an fp32 copy of it (a program that keeps
    its weights fp16: ``Node.weight``): ``compute(w_block, b_block)`` for blocks of the weight's output
    features (its first axis), joined along the result's ``axis``. Each output feature is the same
    fp32 computation over all of its inputs as with the weight widened whole (equal to the bit,
    tested for linear and 1x1 conv); ``compute`` must not keep ``w_block``, whose memory is reused."""
    n = w.shape[0]
    per_row = w[0].numel()
    rows = max(1, min(n, _BLOCK_BYTES // (4 * per_row)))
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.numel() < rows * per_row:
        buf = _SCRATCH.buf = torch.empty(rows * per_row, dtype=F32)
    bias = None if b is None else widen(b)
    parts = []
    for i in range(0, n, rows):
        j = min(n, i + rows)
        block = buf[: (j - i) * per_row].view(j - i, *w.shape[1:])
        block.copy_(w[i:j])
        parts.append(compute(block, None if bias is None else bias[i:j]))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=axis)


def in_fp32(fn, out_dtype: torch.dtype):
    """Wrap ``fn(x, ...)`` so fp16 inputs are computed in fp32 and rounded to ``out_dtype``."""
    if out_dtype in _WIDEN:

        def run(x, *rest):
            return fn(x.float(), *rest).to(out_dtype)

        return run

    def run_native(x, *rest):
        y = fn(x, *rest)
        return y if y.dtype == out_dtype else y.to(out_dtype)

    return run_native


def norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise IndexError(f"axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def norm_axes(axes, rank: int) -> list[int]:
    return [norm_axis(int(a), rank) for a in axes]


def scalar(value) -> float | int | bool:
    """A 0-d tensor / numpy scalar / python number as a python number."""
    if isinstance(value, torch.Tensor):
        return value.reshape(()).item()
    if hasattr(value, "item"):
        return value.item()
    return value


def ints(value) -> list[int]:
    """A const or run-time int vector as a python list."""
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.reshape(-1).tolist()]
    return [int(v) for v in value]
