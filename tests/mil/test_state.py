"""State ops (read_state / write_state / coreml_update_state) and the slice ops a KV cache
lowers to, vs numpy; the state API (make_state, run(state=...)) and its errors."""
from __future__ import annotations

import shutil
import tempfile

import numpy as np
import pytest
import coremltools as ct
from coremltools.converters.mil.backend.mil.load import load as backend_load
from coremltools.converters.mil.mil import Builder as mb
from coremltools.converters.mil.mil import Function, Program, types

from anetts.mil import MilInputError, MilRuntimeError, program_from_spec
from miltest import assert_close, rng, run

R = rng(11)
SHAPE = (2, 3)


def state_program(body, shape=SHAPE, extra_inputs=None):
    """An iOS18 program with fp32 input x, one fp16 state `acc`, and `body(x16, acc, **extra)`'s outputs."""
    placeholders = {"x": mb.placeholder(shape=shape, dtype=types.fp32),
                    "acc": mb.state_tensor_placeholder(shape=shape, dtype=types.fp16)}
    for name, (s, dt) in (extra_inputs or {}).items():
        placeholders[name] = mb.placeholder(shape=s, dtype=dt)
    prog = Program()
    with Function(placeholders, opset_version=ct.target.iOS18) as f:
        ins = dict(f.inputs)
        x16 = mb.cast(x=ins.pop("x"), dtype="fp16")
        acc = ins.pop("acc")
        f.set_outputs(list(body(x16, acc, **ins)))
    prog.add_function("main", f)
    wdir = tempfile.mkdtemp(prefix="milstate")
    try:
        return program_from_spec(backend_load(prog, weights_dir=wdir, specification_version=9), wdir, "<state test>")
    finally:
        shutil.rmtree(wdir, ignore_errors=True)


def accumulate(x16, acc):
    total = mb.add(x=mb.read_state(input=acc), y=x16)
    updated = mb.coreml_update_state(state=acc, value=total)  # serialized as write_state + read_state
    return [mb.cast(x=mb.mul(x=updated, y=np.float16(2)), dtype="fp32")]


def test_state_accumulates_in_fp16_across_calls():
    prog = state_program(accumulate)
    ops = prog.op_types()
    assert ops["write_state"] == 1 and ops["read_state"] == 2
    (spec,) = prog.state_specs()
    assert (spec.name, spec.shape, spec.mil_dtype) == ("acc", SHAPE, "fp16")
    state = prog.make_state()
    assert state.read("acc").dtype == np.float16 and not state["acc"].any()  # zero-filled, as Core ML
    want = np.zeros(SHAPE, np.float16)
    for _ in range(3):
        x = R.standard_normal(SHAPE).astype(np.float32) * 100
        (out,) = prog.run({"x": x}, state=state).values()
        want = (want + x.astype(np.float16)).astype(np.float16)  # every step rounds to fp16
        assert_close(state["acc"], want, rtol=0, atol=0)
        assert_close(out, (want * np.float16(2)).astype(np.float32), rtol=0, atol=0)


def test_state_write_and_copy():
    prog = state_program(accumulate)
    state = prog.make_state()
    state.write("acc", np.full(SHAPE, 0.1, np.float32))  # rounded to the fp16 buffer
    assert state["acc"].dtype == np.float16 and state["acc"][0, 0] == np.float16(0.1)
    snapshot = state.copy()
    prog.run({"x": np.ones(SHAPE, np.float32)}, state=state)
    assert_close(snapshot["acc"], np.full(SHAPE, 0.1, np.float16), rtol=0, atol=0)
    assert_close(state["acc"], np.full(SHAPE, np.float16(0.1) + np.float16(1), np.float16), rtol=0, atol=0)
    with pytest.raises(MilInputError, match=r"state 'acc' has shape \(2, 3\), got \(3,\)"):
        state.write("acc", np.zeros(3))
    with pytest.raises(MilInputError, match="no state 'kv'"):
        state.read("kv")


def test_state_errors_name_the_state():
    prog = state_program(accumulate)
    x = np.ones(SHAPE, np.float32)
    with pytest.raises(MilInputError, match=r"has states acc; pass state=program.make_state\(\)"):
        prog.run({"x": x})
    other = state_program(accumulate, shape=(3, 2)).make_state()
    with pytest.raises(MilInputError, match=r"state 'acc' is fp16\[2, 3\] in the function, fp16\[3, 2\]"):
        prog.run({"x": x}, state=other)
    with pytest.raises(MilInputError, match="must be a MilState"):
        prog.run({"x": x}, state={"acc": np.zeros(SHAPE)})


def test_failed_call_leaves_state_unchanged():
    """The state commits only when every op of the call ran."""

    def write_then_gather(x16, acc, idx):
        updated = mb.coreml_update_state(state=acc, value=mb.add(x=mb.read_state(input=acc), y=x16))
        return [mb.cast(x=mb.gather(x=updated, indices=idx, axis=0), dtype="fp32")]

    prog = state_program(write_then_gather, extra_inputs={"idx": ((1,), types.int32)})
    state = prog.make_state()
    x = np.ones(SHAPE, np.float32)
    prog.run({"x": x, "idx": np.array([1], np.int32)}, state=state)
    assert_close(state["acc"], np.ones(SHAPE, np.float16), rtol=0, atol=0)
    with pytest.raises(MilRuntimeError, match="gather"):
        prog.run({"x": x, "idx": np.array([5], np.int32)}, state=state)  # write_state ran, gather failed
    assert_close(state["acc"], np.ones(SHAPE, np.float16), rtol=0, atol=0)


@pytest.mark.parametrize("begin,end,stride,begin_mask,end_mask,squeeze_mask", [
    ([0, 0, 3, 0], [1, 2, 5, 4], None, None, None, None),  # a 2-token KV write at position 3
    ([0, 0, 7, 0], [1, 2, 8, 4], None, None, None, [False, False, True, False]),  # one token, squeezed
    ([0, 1, -3, 0], [0, 2, -1, 0], None, [True, False, False, True], [True, False, False, True], None),
    ([0, 0, 1, 0], [1, 2, 8, 4], [1, 1, 3, 2], None, None, None),
    ([0, 0, 6, 0], [1, 2, 1, 4], [1, 1, -2, 1], None, None, None),  # negative stride: rows 6, 4, 2
])
def test_slice_update_with_runtime_bounds_vs_numpy(begin, end, stride, begin_mask, end_mask, squeeze_mask):
    x = R.standard_normal((1, 2, 8, 4)).astype(np.float32)
    want = x.copy()
    idx = []
    for d, n in enumerate(x.shape):
        if squeeze_mask and squeeze_mask[d]:
            idx.append(begin[d])
            continue
        b = None if begin_mask and begin_mask[d] else begin[d]
        e = None if end_mask and end_mask[d] else end[d]
        idx.append(slice(b, e, stride[d] if stride else 1))
    update = R.standard_normal(want[tuple(idx)].shape).astype(np.float32)
    want[tuple(idx)] = update
    kw = {k: np.array(v, np.int32 if k == "stride" else np.bool_) for k, v in
          (("stride", stride), ("begin_mask", begin_mask), ("end_mask", end_mask), ("squeeze_mask", squeeze_mask))
          if v is not None}
    (got,) = run(lambda x, u, b, e: mb.slice_update(x=x, update=u, begin=b, end=e, **kw),
                 {"x": x, "u": update, "b": np.array(begin, np.int32), "e": np.array(end, np.int32)}, opset=18)
    assert_close(got, want, rtol=0, atol=0)


def test_slice_by_index_squeezes_a_size_one_dim():
    """`pos[0]` of a [1] int32 input: squeeze_mask on a dim the slice covers whole still drops it."""
    (got,) = run(lambda p: mb.slice_by_index(x=p, begin=np.array([0], np.int32), end=np.array([1], np.int32),
                                               squeeze_mask=np.array([True])), {"p": np.array([5], np.int32)},
                 opset=18)
    assert got.shape == () and int(got) == 5
