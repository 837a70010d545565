"""Helpers for the MIL executor tests: build one-op MIL programs and run them.

``run(build, inputs)`` builds a pymil program whose function inputs are placeholders
shaped like ``inputs``, serializes it with coremltools' mlprogram backend (the same
protobuf writer ``ct.convert`` uses, without the optimization passes that would fold
or rewrite the op under test), loads it with the executor and runs it.

``value_inference(build, inputs)`` builds the same op on *constant* inputs, which makes
pymil evaluate it with the op class's own ``value_inference`` (numpy): the independent
reference for ops that have one.
"""
from __future__ import annotations

import shutil
import tempfile

import numpy as np
import coremltools as ct
from coremltools.converters.mil.backend.mil.load import load as backend_load
from coremltools.converters.mil.mil import Builder as mb
from coremltools.converters.mil.mil import Function, Program, types

from anetts.mil import program_from_spec

TARGETS = {15: ct.target.iOS15, 16: ct.target.iOS16, 17: ct.target.iOS17, 18: ct.target.iOS18}
SPEC_VERSION = {15: 6, 16: 7, 17: 8, 18: 9}
_NP2MIL = {
    np.dtype(np.float16): types.fp16,
    np.dtype(np.float32): types.fp32,
    np.dtype(np.int32): types.int32,
    np.dtype(np.bool_): types.bool,
}


def _outputs(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


def build_program(build, inputs: dict[str, np.ndarray], opset: int = 16, widen_weights: bool = True):
    """ML Programs take no bool I/O: bool inputs arrive as int32 and are cast inside,
    bool outputs are cast to int32 (``run`` turns them back into bool)."""
    placeholders = {
        n: mb.placeholder(shape=a.shape, dtype=types.int32 if a.dtype == np.bool_ else _NP2MIL[a.dtype])
        for n, a in inputs.items()
    }
    prog = Program()
    with Function(placeholders, opset_version=TARGETS[opset]) as f:
        args = {n: mb.cast(x=v, dtype="bool") if inputs[n].dtype == np.bool_ else v for n, v in f.inputs.items()}
        outs = _outputs(build(**args))
        f.set_outputs([mb.cast(x=o, dtype="int32") if o.dtype == types.bool else o for o in outs])
        bool_outputs = [o.dtype == types.bool for o in outs]
    prog.add_function("main", f)
    wdir = tempfile.mkdtemp(prefix="miltest")
    try:
        spec = backend_load(prog, weights_dir=wdir, specification_version=SPEC_VERSION[opset])
        mp = program_from_spec(spec, wdir, package=f"<test iOS{opset}>", widen_weights=widen_weights)
        mp.bool_outputs = bool_outputs
        return mp
    finally:
        shutil.rmtree(wdir, ignore_errors=True)


def run(build, inputs: dict[str, np.ndarray], opset: int = 16, widen_weights: bool = True) -> list[np.ndarray]:
    """Executor outputs of the program ``build`` makes from placeholders like ``inputs``."""
    prog = build_program(build, inputs, opset, widen_weights)
    feed = {n: a.astype(np.int32) if a.dtype == np.bool_ else a for n, a in inputs.items()}
    outs = list(prog.run(feed).values())
    return [o.astype(np.bool_) if b else o for o, b in zip(outs, prog.bool_outputs)]


def value_inference(build, inputs: dict[str, np.ndarray], opset: int = 16) -> list[np.ndarray]:
    """coremltools' value_inference of the same op on constant inputs."""
    with Function({}, opset_version=TARGETS[opset]):
        outs = _outputs(build(**{n: mb.const(val=a) for n, a in inputs.items()}))
        vals = [o.val for o in outs]
    if any(v is None for v in vals):
        raise AssertionError("op has no value_inference for these inputs")
    return [np.asarray(v) for v in vals]


def assert_close(got: np.ndarray, want: np.ndarray, rtol=1e-6, atol=1e-6, dtype=None):
    got, want = np.asarray(got), np.asarray(want)
    if dtype is not None:
        assert got.dtype == np.dtype(dtype), (got.dtype, dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if got.dtype == np.bool_ or want.dtype == np.bool_ or got.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want.astype(got.dtype))
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)


def check_vs_value_inference(build, inputs, opset=16, rtol=1e-6, atol=1e-6):
    """Executor == value_inference (shape, dtype and values) for every output."""
    got = run(build, inputs, opset)
    want = value_inference(build, inputs, opset)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype or (w.dtype == np.float64 and g.dtype.kind == "f") or (
            w.dtype == np.int64 and g.dtype == np.int32
        ), (g.dtype, w.dtype)
        assert_close(g, w, rtol, atol)
    return got


def snr_db(ref: np.ndarray, x: np.ndarray) -> float:
    ref = np.asarray(ref, np.float64)
    err = ref - np.asarray(x, np.float64)
    return float(10 * np.log10((ref**2).sum() / max((err**2).sum(), 1e-300)))


def rng(seed=0):
    return np.random.default_rng(seed)
