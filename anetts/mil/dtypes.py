"""MIL data types and their torch / numpy counterparts.

Values between ops are torch tensors whose dtype is the MIL dtype's natural torch
dtype: fp16 -> torch.float16, fp32 -> torch.float32, int32 -> torch.int32, bool ->
torch.bool, ... so the precision a program declares is the precision we hold.
"""
from __future__ import annotations

import numpy as np
import torch
from coremltools.proto import MIL_pb2

PROTO_TO_NAME = {
    MIL_pb2.BOOL: "bool",
    MIL_pb2.STRING: "str",
    MIL_pb2.FLOAT16: "fp16",
    MIL_pb2.FLOAT32: "fp32",
    MIL_pb2.FLOAT64: "fp64",
    MIL_pb2.BFLOAT16: "bf16",
    MIL_pb2.INT8: "int8",
    MIL_pb2.INT16: "int16",
    MIL_pb2.INT32: "int32",
    MIL_pb2.INT64: "int64",
    MIL_pb2.UINT8: "uint8",
    MIL_pb2.UINT16: "uint16",
    MIL_pb2.UINT32: "uint32",
    MIL_pb2.UINT64: "uint64",
    MIL_pb2.INT4: "int4",
    MIL_pb2.UINT1: "uint1",
    MIL_pb2.UINT2: "uint2",
    MIL_pb2.UINT3: "uint3",
    MIL_pb2.UINT4: "uint4",
    MIL_pb2.UINT6: "uint6",
}

TORCH_DTYPES: dict[str, torch.dtype] = {
    "bool": torch.bool,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "fp64": torch.float64,
    "bf16": torch.bfloat16,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "uint16": torch.uint16,
    "uint32": torch.uint32,
    "uint64": torch.uint64,
}

NUMPY_DTYPES: dict[str, np.dtype] = {
    "bool": np.dtype(np.bool_),
    "fp16": np.dtype(np.float16),
    "fp32": np.dtype(np.float32),
    "fp64": np.dtype(np.float64),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64),
}

_NP_TO_NAME = {v: k for k, v in NUMPY_DTYPES.items()}

FLOAT_NAMES = frozenset({"fp16", "fp32", "fp64", "bf16"})


def name_of_numpy(dtype) -> str:
    return _NP_TO_NAME[np.dtype(dtype)]


def to_torch(value, dtype: str | None = None) -> torch.Tensor:
    """A numpy array / numpy or python scalar as a torch tensor (no copy if possible)."""
    arr = np.asarray(value)
    if dtype is not None:
        arr = arr.astype(NUMPY_DTYPES[dtype], copy=False)
    if arr.dtype == np.float64 and dtype is None:
        # MIL has no fp64 tensors at runtime; python floats come from fp32 consts
        arr = arr.astype(np.float32)
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr).copy()
    return torch.from_numpy(arr)


def to_numpy(t: torch.Tensor, dtype: str | None) -> np.ndarray:
    """A runtime tensor as numpy, in the MIL dtype ``dtype`` when given."""
    if t.dtype == torch.uint16:
        arr = t.to(torch.int32).numpy().astype(np.uint16)
    elif t.dtype == torch.bfloat16:
        arr = t.float().numpy()
    else:
        arr = t.detach().numpy()
    if dtype is not None and dtype in NUMPY_DTYPES and arr.dtype != NUMPY_DTYPES[dtype]:
        arr = arr.astype(NUMPY_DTYPES[dtype])
    return arr
