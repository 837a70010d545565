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
