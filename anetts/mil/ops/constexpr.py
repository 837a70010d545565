"""Load-time evaluation of ``constexpr_*`` ops (compressed / cast weights).

These ops only ever take constants, so they are folded into plain constants while the
program loads.  Decompression uses the ``decompress`` static methods of coremltools'
own op classes (iOS16 ``constexpr_ops.py`` and iOS18 ``compression.py``), i.e. the
reference implementation of each storage format.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import UnsupportedOpError


def _ios16():
    from coremltools.converters.mil.mil.ops.defs.iOS16 import constexpr_ops

    return constexpr_ops


def _ios18():
    from coremltools.converters.mil.mil.ops.defs.iOS18 import compression

    return compression


def evaluate_constexpr(op_type: str, p: dict[str, Any], opset: int, package: str, name: str):
    """The value (or tuple of values for multi-output ops) of one constexpr op."""
    if op_type == "constexpr_cast":
        dtype = str(np.asarray(p["output_dtype"]).reshape(()).item())
        if dtype != "fp32":
            raise UnsupportedOpError(package, {f"{op_type}: output_dtype={dtype}": [name]})
        return np.asarray(p["source_val"]).astype(np.float32)
    if op_type == "constexpr_affine_dequantize":
        axis = int(np.asarray(p["axis"]).reshape(()))
        return _ios16().constexpr_affine_dequantize.decompress(
            np.asarray(p["quantized_data"]), np.asarray(p["zero_point"]), np.asarray(p["scale"]), axis
        )
    if op_type == "constexpr_lut_to_dense":
        if "shape" in p:  # iOS16 form: packed uint8 indices + flat lut + shape
            return _ios16().constexpr_lut_to_dense.decompress(
                np.asarray(p["lut"]), np.asarray(p["indices"]), np.asarray(p["shape"])
            )
        va = p.get("vector_axis")
        return _ios18().constexpr_lut_to_dense.decompress(
            np.asarray(p["indices"]), np.asarray(p["lut"]), None if va is None else np.asarray(va).reshape(())
        )
    if op_type == "constexpr_sparse_to_dense":
        if "shape" in p:
            return _ios16().constexpr_sparse_to_dense.decompress(
                np.asarray(p["nonzero_data"]), np.asarray(p["mask"]), np.asarray(p["shape"])
            )
        return _ios18().constexpr_sparse_to_dense.decompress(np.asarray(p["nonzero_data"]), np.asarray(p["mask"]))
    if op_type == "constexpr_blockwise_shift_scale":
        off = p.get("offset")
        return _ios18().constexpr_blockwise_shift_scale.decompress(
            np.asarray(p["data"]), np.asarray(p["scale"]), None if off is None else np.asarray(off)
        )
    if op_type == "constexpr_lut_to_sparse":
        va = p.get("vector_axis")
        return _ios18().constexpr_lut_to_sparse.decompress(
            np.asarray(p["indices_mask"]),
            np.asarray(p["indices_nonzero_data"]),
            np.asarray(p["lut"]),
            None if va is None else np.asarray(va).reshape(()),
        )
    if op_type == "constexpr_sparse_blockwise_shift_scale":
        off = p.get("offset")
        return _ios18().constexpr_sparse_blockwise_shift_scale.decompress(
            np.asarray(p["data_mask"]),
            np.asarray(p["nonzero_data"]),
            np.asarray(p["scale"]),
            None if off is None else np.asarray(off),
        )
    raise UnsupportedOpError(package, {op_type: [name]})


CONSTEXPR_OPS = (
    "constexpr_affine_dequantize",
    "constexpr_blockwise_shift_scale",
    "constexpr_cast",
    "constexpr_lut_to_dense",
    "constexpr_lut_to_sparse",
    "constexpr_sparse_blockwise_shift_scale",
    "constexpr_sparse_to_dense",
)
