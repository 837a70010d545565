"""constexpr_* decompression (compressed weights) vs independent numpy implementations, bit for bit.

Each reference below is written from the op's definition in the MIL spec (coremltools' op
docstrings), not from coremltools' `decompress` helpers that the executor calls, so a change in
either shows up here. The last tests compress real packages with `coremltools.optimize.coreml`
(int8 per-channel / per-block, int4 per-block, LUT 4/6 per-tensor, LUT 3 per-grouped-channel) and check that
the executor runs them, bit-exact against the same program after coremltools' own
`decompress_weights`, and within the quantization error of the original weights.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from anetts.mil.ops.constexpr import evaluate_constexpr

RNG = np.random.default_rng(0)


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _pack_lsb_first(values: np.ndarray, nbits: int) -> np.ndarray:
    """The MIL blob layout of sub-byte values: element 0 in the lowest bits of byte 0, and on up."""
    bits = [(int(v) >> k) & 1 for v in values.ravel() for k in range(nbits)]
    bits += [0] * (-len(bits) % 8)
    return np.array([sum(bits[i + k] << k for k in range(8)) for i in range(0, len(bits), 8)], dtype=np.uint8)


# ---------------------------------------------------------------------------------- iOS16 ops
@pytest.mark.parametrize("qdtype", [np.int8, np.uint8])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("fdtype", [np.float16, np.float32])
def test_affine_dequantize_per_channel(qdtype, axis, fdtype):
    info = np.iinfo(qdtype)
    q = RNG.integers(info.min, info.max + 1, size=(6, 5, 3)).astype(qdtype)
    n = q.shape[axis]
    zp = RNG.integers(info.min, info.max + 1, size=n).astype(qdtype)
    scale = (RNG.random(n) * 0.1 + 1e-3).astype(fdtype)
    got = evaluate_constexpr("constexpr_affine_dequantize", {"quantized_data": q, "zero_point": zp, "scale": scale,
                                                             "axis": np.int32(axis)}, 16, "<t>", "w")
    shape = [1] * q.ndim
    shape[axis] = n
    # (q - zp) is an exact small integer and its product with an fp16 scale is exact in fp64, so one
    # rounding to the scale's dtype is the correctly rounded result however a device evaluates it
    want = ((q.astype(np.float64) - zp.reshape(shape)) * scale.reshape(shape).astype(np.float64)).astype(fdtype)
    assert _bits_equal(got, want)


def test_affine_dequantize_per_tensor_scalars():
    q = RNG.integers(-128, 128, size=(4, 7)).astype(np.int8)
    got = evaluate_constexpr("constexpr_affine_dequantize", {"quantized_data": q, "zero_point": np.int8(3),
                                                             "scale": np.float16(0.0371), "axis": np.int32(0)},
                             16, "<t>", "w")
    want = ((q.astype(np.float64) - 3) * np.float64(np.float16(0.0371))).astype(np.float16)
    assert _bits_equal(got, want)


@pytest.mark.parametrize("nbits", [1, 2, 4, 6, 8])
def test_lut_to_dense_ios16_packed_indices(nbits):
    shape = (5, 3, 7)  # 105 elements: not a multiple of 8 / nbits, so the last byte is padded
    idx = RNG.integers(0, 2**nbits, size=int(np.prod(shape)))
    lut = RNG.standard_normal(2**nbits).astype(np.float16)
    got = evaluate_constexpr("constexpr_lut_to_dense", {"lut": lut, "indices": _pack_lsb_first(idx, nbits),
                                                        "shape": np.array(shape, dtype=np.uint32)}, 16, "<t>", "w")
    assert _bits_equal(got, lut[idx].reshape(shape))


def test_constexpr_cast_fp16_to_fp32():
    v = RNG.standard_normal((3, 4)).astype(np.float16)
    got = evaluate_constexpr("constexpr_cast", {"source_val": v, "output_dtype": np.str_("fp32")}, 16, "<t>", "w")
    assert _bits_equal(got, v.astype(np.float32))


# ---------------------------------------------------------------------------------- iOS18 ops
def _lut_reference(indices: np.ndarray, lut: np.ndarray, vector_axis: int | None) -> np.ndarray:
    """output[i] = lut[i // block, indices[i], v] with block = indices.shape / lut.shape[:K]."""
    k = indices.ndim
    vs = lut.shape[-1]
    block = [indices.shape[d] // lut.shape[d] for d in range(k)]
    out_shape = list(indices.shape)
    if vs > 1:
        out_shape[vector_axis] *= vs
    out = np.empty(out_shape, dtype=lut.dtype)
    for pos in np.ndindex(*indices.shape):
        table = lut[tuple(p // b for p, b in zip(pos, block))]  # (palette, vector)
        for v in range(vs):
            o = list(pos)
            if vs > 1:
                o[vector_axis] = pos[vector_axis] * vs + v
            out[tuple(o)] = table[indices[pos], v]
    return out


@pytest.mark.parametrize("nbits", [2, 3, 4, 6, 8])
def test_lut_to_dense_ios18_grouped_channel(nbits):
    indices = RNG.integers(0, 2**nbits, size=(8, 6, 2)).astype(np.uint8)
    lut = RNG.standard_normal((4, 1, 1, 2**nbits, 1)).astype(np.float16)  # 4 groups of 2 output channels
    got = evaluate_constexpr("constexpr_lut_to_dense", {"indices": indices, "lut": lut}, 18, "<t>", "w")
    assert _bits_equal(got, _lut_reference(indices, lut, None))


@pytest.mark.parametrize("vector_axis", [0, 1])
def test_lut_to_dense_ios18_vector(vector_axis):
    indices = RNG.integers(0, 4, size=(4, 3)).astype(np.uint8)
    lut = RNG.standard_normal((2, 1, 4, 3)).astype(np.float32)  # 2 groups on axis 0, vectors of 3
    got = evaluate_constexpr("constexpr_lut_to_dense", {"indices": indices, "lut": lut,
                                                        "vector_axis": np.int32(vector_axis)}, 18, "<t>", "w")
    assert got.shape == tuple(s * (3 if d == vector_axis else 1) for d, s in enumerate(indices.shape))
    assert _bits_equal(got, _lut_reference(indices, lut, vector_axis))


def test_lut_to_dense_ios18_spec_example():
    """Case 1 of the op's own documentation, values included."""
    indices = np.array([2, 3, 3, 0, 1, 0, 3, 0, 2, 1, 0, 3], dtype=np.uint8).reshape(6, 2)
    lut = np.array([1.0, 5.0, 9.0, 13.0, 2.0, 10.0, 18.0, 26.0], dtype=np.float16).reshape(2, 1, 4, 1)
    got = evaluate_constexpr("constexpr_lut_to_dense", {"indices": indices, "lut": lut}, 18, "<t>", "w")
    want = np.array([[9, 13], [13, 1], [5, 1], [26, 2], [18, 10], [2, 26]], dtype=np.float16)
    assert _bits_equal(got, want)


@pytest.mark.parametrize("qdtype,lo,hi", [(np.int8, -128, 127), (np.uint8, 0, 255), (np.int8, -8, 7), (np.uint8, 0, 15)])
@pytest.mark.parametrize("with_offset", [False, True])
def test_blockwise_shift_scale(qdtype, lo, hi, with_offset):
    """int8/uint8 and int4/uint4 (the loader hands sub-byte data over as int8/uint8 arrays)."""
    data = RNG.integers(lo, hi + 1, size=(6, 8)).astype(qdtype)
    scale = (RNG.random((3, 2)) * 0.05 + 1e-3).astype(np.float16)  # blocks of 2 rows x 4 columns
    offset = RNG.integers(lo, hi + 1, size=(3, 2)).astype(qdtype) if with_offset else None
    p = {"data": data, "scale": scale, **({"offset": offset} if with_offset else {})}
    got = evaluate_constexpr("constexpr_blockwise_shift_scale", p, 18, "<t>", "w")
    rep = lambda a: np.repeat(np.repeat(a, 2, axis=0), 4, axis=1)  # noqa: E731
    shifted = data.astype(np.float64) - (rep(offset).astype(np.float64) if with_offset else 0)
    want = (shifted * rep(scale).astype(np.float64)).astype(np.float16)
    assert _bits_equal(got, want)


def test_sparse_to_dense_ios18():
    mask = (RNG.random((5, 4)) > 0.5).astype(np.uint8)
    nz = RNG.standard_normal(int(mask.sum())).astype(np.float16)
    got = evaluate_constexpr("constexpr_sparse_to_dense", {"nonzero_data": nz, "mask": mask}, 18, "<t>", "w")
    want = np.zeros((5, 4), np.float16)
    want[mask.astype(bool)] = nz  # row-major order of the set bits
    assert _bits_equal(got, want)


def test_unknown_constexpr_is_named():
    from anetts.mil.errors import UnsupportedOpError

    with pytest.raises(UnsupportedOpError, match="constexpr_future_op"):
        evaluate_constexpr("constexpr_future_op", {}, 18, "<t>", "w")


# ------------------------------------------------ real packages from coremltools.optimize.coreml
@pytest.fixture(scope="module")
def toy_packages(tmp_path_factory):
    """A conv + linear model converted at iOS16 and iOS18 (weights large enough to be compressed)."""
    import coremltools as ct
    import torch

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv = torch.nn.Conv1d(32, 32, 3, padding=1)
            self.lin = torch.nn.Linear(32, 48)

        def forward(self, x):
            return self.lin(torch.relu(self.conv(x)).transpose(1, 2))

    x = torch.randn(1, 32, 16)
    traced = torch.jit.trace(Toy().eval(), x)
    out = {}
    for target in ("iOS16", "iOS18"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = ct.convert(traced, inputs=[ct.TensorType(name="x", shape=x.shape)], convert_to="mlprogram",
                           minimum_deployment_target=getattr(ct.target, target))
        path = tmp_path_factory.mktemp(target) / "toy.mlpackage"
        m.save(str(path))
        out[target] = path
    return out, x.numpy()


CONFIGS = [
    ("iOS16", "linear", {"dtype": "int8", "granularity": "per_channel"}, "constexpr_affine_dequantize"),
    ("iOS16", "palettize", {"nbits": 4, "mode": "kmeans"}, "constexpr_lut_to_dense"),
    ("iOS16", "palettize", {"nbits": 6, "mode": "uniform"}, "constexpr_lut_to_dense"),
    ("iOS18", "linear", {"dtype": "int8", "granularity": "per_block", "block_size": 16}, "constexpr_blockwise_shift_scale"),
    ("iOS18", "linear", {"dtype": "int4", "granularity": "per_block", "block_size": 16}, "constexpr_blockwise_shift_scale"),
    ("iOS18", "palettize", {"nbits": 3, "granularity": "per_grouped_channel", "group_size": 16}, "constexpr_lut_to_dense"),
]


@pytest.mark.parametrize("target,kind,kw,op", CONFIGS, ids=[f"{t}-{k}-{'-'.join(map(str, kw.values()))}" for t, k, kw, _ in CONFIGS])
def test_executor_runs_compressed_packages(toy_packages, tmp_path, target, kind, kw, op):
    import coremltools as ct
    from coremltools.optimize import coreml as cto

    from anetts.mil import load_program

    packages, x = toy_packages
    base = ct.models.MLModel(str(packages[target]), skip_model_load=True)
    cfg = (cto.OpLinearQuantizerConfig if kind == "linear" else cto.OpPalettizerConfig)(weight_threshold=512, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        small = (cto.linear_quantize_weights if kind == "linear" else cto.palettize_weights)(
            base, cto.OptimizationConfig(global_config=cfg))
        dense = cto.decompress_weights(small)
    small.save(str(tmp_path / "small.mlpackage"))
    dense.save(str(tmp_path / "dense.mlpackage"))

    prog = load_program(tmp_path / "small.mlpackage")
    ref = load_program(tmp_path / "dense.mlpackage")
    base_prog = load_program(packages[target])
    assert op in {o.type for o in _spec_ops(tmp_path / "small.mlpackage")}
    # every decompressed weight: bit-identical to coremltools' own decompression, and within the
    # format's error of the original fp16 weight (a mis-unpacked sub-byte index would be far off)
    consts, dense_consts = _consts(tmp_path / "small.mlpackage"), _consts(tmp_path / "dense.mlpackage")
    compressed = [n for n in consts if n in dense_consts and np.asarray(consts[n]).size >= 512]
    assert compressed
    for name in compressed:
        got, want = np.asarray(consts[name]), np.asarray(dense_consts[name])
        assert _bits_equal(got, want), name
    got = prog.run({"x": x})
    want = ref.run({"x": x})
    for k in want:
        assert _bits_equal(got[k], want[k])
    base_out = base_prog.run({"x": x})
    for k in base_out:
        err = np.abs(got[k].astype(np.float64) - base_out[k]).max() / np.abs(base_out[k]).max()
        limit = {3: 0.5, 4: 0.25, 6: 0.08, 8: 0.03}.get(kw.get("nbits"), 0.15 if kw.get("dtype") == "int4" else 0.03)
        assert err < limit, (k, err)


def _spec_ops(package):
    import coremltools as ct

    spec = ct.utils.load_spec(str(package))
    return [op for fn in spec.mlProgram.functions.values() for b in fn.block_specializations.values() for op in b.operations]


def _consts(package):
    """The executor's folded constants of `main` (constexpr outputs included), by var name."""
    from anetts.mil.spec import load_spec, package_paths, parse_program

    _, spec_file, weights = package_paths(package)
    return parse_program(load_spec(spec_file), str(weights), str(package))["main"].consts
