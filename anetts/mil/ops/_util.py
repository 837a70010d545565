"""Helpers shared by the op modules.

Precision policy (what "fp16-faithful" means here)
--------------------------------------------------
Values live in the dtype the program declares.  An op whose result is fp16 is computed
the way most fp16 hardware computes it: inputs are widened to fp32, the op runs in fp32
(accumulations included), and the result is rounded once to fp16 (round-to-nearest-even,
overflow to +-inf).  Basic arithmetic (add/sub/mul/div/min/max/compare) on fp16 tensors
runs directly on torch.float16, which on CPU is exactly that (widen, compute, round
once); the test-suite checks this bit-for-bit.  Transcendental ops are explicitly
widened because torch's native half kernels for some of them (rsqrt, log, erf, gelu)
are not correctly rounded.
"""
from __future__ import annotations

import torch

F16 = torch.float16
F32 = torch.float32
_WIDEN = (torch.float16, torch.bfloat16)


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
