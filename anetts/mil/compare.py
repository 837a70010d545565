"""Whether two functions of ML Programs compute the same thing in this executor, without running them.

A multifunction bundle re-serialises each verified per-bucket package as one of its functions: the
same ops on the same values, but an inline const may become a blob, const names change, and the
opset rises to iOS18 (multifunction needs it). `function_difference` holds a bundle's function
against its source package: equal inputs, outputs and declared types, the same ops in the same
order wired through the same vars, every constant (folded constexprs included) equal to the byte,
and no op whose kernel changes behaviour at an opset between the two (`Node.opset_at_least`). When
all of that holds, the executor runs the two alike, so the package's verified outputs are the
function's (`anetts.verify.parity.check_bundle_parity`).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .errors import MilLoadError
from .program import MilProgram, _Step
from .spec import BlockIR, FunctionIR, OpIR, load_spec, package_paths, parse_program


def function_difference(program: MilProgram, function: str, source: FunctionIR) -> str | None:
    """None when `function` of the loaded `program` runs as `source` (a parsed function, such as
    `package_function`'s) would; otherwise the first difference, in words."""
    f = program._fn(function)
    ir = f.ir
    if ir.inputs != source.inputs:
        return f"inputs {ir.inputs} vs {source.inputs}"
    why = _block_difference(ir.block, source.block)
    if why is not None:
        return why
    lo, hi = sorted((ir.opset_version, source.opset_version))
    return _opset_crossing(f.steps, lo, hi)


def _opset_crossing(steps: list[_Step], lo: int, hi: int) -> str | None:
    """The first op whose kernel reads a boundary v with lo < v <= hi (it may run differently)."""
    for s in steps:
        crossed = sorted(v for v in s.opset_boundaries if lo < v <= hi)
        if crossed:
            return f"{s.op_type} op {s.op_name!r} runs differently from opset {crossed[0]} on (opsets {lo} and {hi})"
    return None


def _block_difference(a: BlockIR, b: BlockIR) -> str | None:
    if a.inputs != b.inputs:
        return f"block inputs {a.inputs} vs {b.inputs}"
    if a.outputs != b.outputs:
        return f"outputs {a.outputs} vs {b.outputs}"
    if len(a.ops) != len(b.ops):
        return f"{len(a.ops)} ops vs {len(b.ops)}"
    return _first(_op_difference(x, y) for x, y in zip(a.ops, b.ops))


def _op_difference(x: OpIR, y: OpIR) -> str | None:
    where = f"{x.type} op {x.name!r}"
    if (x.type, x.name) != (y.type, y.name):
        return f"{where} vs {y.type} op {y.name!r}"
    if x.outputs != y.outputs:
        return f"{where}: outputs {x.outputs} vs {y.outputs}"
    if x.inputs.keys() != y.inputs.keys():
        return f"{where}: inputs {sorted(x.inputs)} vs {sorted(y.inputs)}"
    for param, xs in x.inputs.items():
        ys = y.inputs[param]
        if len(xs) != len(ys):
            return f"{where}: input {param!r} has {len(xs)} bindings vs {len(ys)}"
        for u, v in zip(xs, ys):
            if u.is_const != v.is_const:
                return f"{where}: input {param!r} is constant in one program only"
            # a constant's name is the serialiser's (inline in one, a named blob in the other)
            if u.is_const and not _same_value(u.value, v.value):
                return f"{where}: input {param!r} holds another value"
            if not u.is_const and u.name != v.name:
                return f"{where}: input {param!r} is {u.name!r} vs {v.name!r}"
    if len(x.blocks) != len(y.blocks):
        return f"{where}: {len(x.blocks)} blocks vs {len(y.blocks)}"
    why = _first(_block_difference(bx, by) for bx, by in zip(x.blocks, y.blocks))
    return None if why is None else f"{where}: {why}"


def _first(differences) -> str | None:
    """The first difference that is not None (the rest are not computed)."""
    return next((why for why in differences if why is not None), None)


def _same_value(a: Any, b: Any) -> bool:
    """Equal to the byte: dtype, shape and contents (so -0.0 and NaN payloads count)."""
    if isinstance(a, (str, bytes)) or isinstance(b, (str, bytes)):
        return type(a) is type(b) and a == b
    x, y = np.asarray(a), np.asarray(b)
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    if x.dtype == object:
        return all(_same_value(u, v) for u, v in zip(x.ravel(), y.ravel()))
    return np.ascontiguousarray(x).tobytes() == np.ascontiguousarray(y).tobytes()


def package_function(package) -> FunctionIR:
    """The one function of a per-bucket package, parsed (constants decoded, constexprs folded)."""
    pkg, spec_file, weights_dir = package_paths(package)
    problems: dict[str, list[str]] = {}
    functions = parse_program(load_spec(spec_file), str(weights_dir) if weights_dir else None, str(pkg), problems)
    if problems or len(functions) != 1:
        raise MilLoadError(f"{pkg}: not a one-function package the executor reads "
                           f"({len(functions)} functions; {problems or 'no unreadable constexpr'})")
    return next(iter(functions.values()))
