"""State ops (iOS18): ``read_state``, ``write_state`` and the ``coreml_update_state`` dialect op.

The state var is bound to a :class:`anetts.mil.state.StateCell` for the run.  ``read_state``
returns the cell's tensor without copying: kernels never mutate their inputs (constants are
shared between runs, so none may), and ``write_state`` replaces the cell's tensor instead of
writing into it, so a value read earlier keeps its content, as MIL's copying read does.
"""
from __future__ import annotations

from ..errors import MilRuntimeError
from ..registry import Kernel, Node, register
from ..state import StateCell


def _cell(x, op: str) -> StateCell:
    if not isinstance(x, StateCell):
        raise MilRuntimeError(f"{op}: input is not a state (got {type(x).__name__})")
    return x


@register("read_state")
def _read_state(node: Node) -> Kernel:
    def run(state):
        return _cell(state, "read_state").value

    return Kernel(run, ["input"])


@register("write_state")
def _write_state(node: Node) -> Kernel:
    def run(state, data):
        _cell(state, "write_state").write(data)
        return ()

    return Kernel(run, ["input", "data"])


@register("coreml_update_state")
def _coreml_update_state(node: Node) -> Kernel:
    # serialized programs carry write_state + read_state; pymil programs keep this form
    def run(state, value):
        _cell(state, "coreml_update_state").write(value)
        return value

    return Kernel(run, ["state", "value"])
