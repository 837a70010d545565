"""anetts.mil.compare: a program is the same computation as another only where no op's kernel
changes between their opsets (`Node.opset_at_least`)."""
from __future__ import annotations

import numpy as np
import pytest
from coremltools.converters.mil.mil import Builder as mb

from anetts.mil.compare import function_difference
from anetts.mil.errors import MilRuntimeError
from miltest import build_program

X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


def _ir(program):
    return program._fn("main").ir


def test_a_reshape_whose_zeros_change_meaning_is_not_the_same_across_ios17():
    """A 0 in a run-time shape copies x's dim at the same index before iOS17 (the shape as long as
    x's rank), counted from the right from it: the iOS16 and iOS18 programs are op for op alike,
    and still compute differently."""
    def reshape(x, s):
        return mb.reshape(x=x, shape=s, name="y")

    inputs = {"x": X, "s": np.array([0, -1], np.int32)}
    ios16, ios17, ios18 = (build_program(reshape, inputs, opset) for opset in (16, 17, 18))
    with pytest.raises(MilRuntimeError, match="has 0 but its length"):
        ios16.run(inputs)
    assert next(iter(ios18.run(inputs).values())).shape == (3, 8)
    why = function_difference(ios18, "main", _ir(ios16))
    assert why == "reshape op 'y' runs differently from opset 17 on (opsets 16 and 18)"
    assert function_difference(ios18, "main", _ir(ios17)) is None  # no change between 17 and 18
    assert function_difference(ios16, "main", _ir(ios16)) is None


def test_a_constant_shape_without_zeros_reads_the_same_in_every_opset():
    def reshape(x):
        return mb.reshape(x=x, shape=np.array([-1, 4], np.int32), name="y")

    ios16, ios18 = (build_program(reshape, {"x": X}, opset) for opset in (16, 18))
    assert function_difference(ios18, "main", _ir(ios16)) is None
