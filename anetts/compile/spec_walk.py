"""Walking a saved ML Program's protobuf spec: its ops, the dims its tensors declare, literal ints.

The one walker of a package's op tree, shared by the inspector and lint (:mod:`anetts.compile.inspect`),
the MAC counter (:mod:`anetts.compile.macs`), compression and the rewrites. Reads protobuf only.
"""
from __future__ import annotations


def tensor_dims(tt) -> list[int | None]:
    """The dims of a tensor type; None for a dim that is not a constant."""
    return [int(d.constant.size) if d.WhichOneof("dimension") == "constant" else None for d in tt.dimensions]


def block_ops(block):
    """Every op of a block, nested blocks included (also a Mac compute plan's blocks, which nest alike)."""
    for op in block.operations:
        yield op
        for nested in op.blocks:
            yield from block_ops(nested)


def _function_blocks(fn):
    """The block of a MIL function used at run time (its opset), plus any other specialisation."""
    if fn.opset in fn.block_specializations:
        return [fn.block_specializations[fn.opset]]
    return list(fn.block_specializations.values())


def function_ops(fn) -> list:
    """Every op of one function of a saved ML Program's spec: its run-time block, nested blocks
    (loops, conditions) included."""
    return [op for block in _function_blocks(fn) for op in block_ops(block)]


def program_ops(spec):
    """(function name, op) for every op of every function (`function_ops`)."""
    for fname, fn in spec.mlProgram.functions.items():
        for op in function_ops(fn):
            yield fname, op


def immediate_ints(val) -> list[int]:
    """The ints of a literal int tensor value (an op's attribute or inline input); [] for anything else."""
    if val.WhichOneof("value") != "immediateValue":
        return []
    iv = val.immediateValue
    if iv.WhichOneof("value") == "tensor":
        t = iv.tensor
        which = t.WhichOneof("value")
        if which in ("ints", "longInts"):
            return [int(x) for x in getattr(t, which).values]
    return []
