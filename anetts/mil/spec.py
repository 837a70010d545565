"""Read the ML Program inside an .mlpackage into a small, executor-friendly IR.

We read the protobuf directly (not coremltools' pymil ``Program``) because:

* pymil re-runs type inference and op validation for every op, which is slow for
  large programs and sometimes rejects programs that Core ML itself accepts;
* the executor wants the *declared* output types of every op (to hold fp16 where the
  program computes in fp16, and to check every op's result against its declaration).

Values stored in the program (``const`` ops, inline values, weight.bin blobs) are
decoded with coremltools' own milproto value reader, so every storage dtype it knows
(incl. sub-byte types used by compressed weights) decodes exactly as coremltools does.
``constexpr_*`` ops are evaluated here, at load time, into plain constants.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .dtypes import PROTO_TO_NAME
from .errors import MilLoadError

NO_VALUE = object()


@dataclass(frozen=True)
class ValueType:
    """Declared type of a var.  ``shape`` entries are ints, or None for unknown dims."""

    kind: str  # "tensor" | "list" | "tuple" | "dict" | "state"
    dtype: str | None = None
    shape: tuple[int | None, ...] | None = None  # None: unknown rank

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(d is not None for d in self.shape)

    def describe(self) -> str:
        if self.kind != "tensor":
            return self.kind
        dims = "?" if self.shape is None else ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.dtype}[{dims}]"


def parse_value_type(vt) -> ValueType:
    which = vt.WhichOneof("type")
    if which == "tensorType":
        tt = vt.tensorType
        dtype = PROTO_TO_NAME.get(tt.dataType, f"proto{tt.dataType}")
        if tt.rank < 0:
            return ValueType("tensor", dtype, None)
        dims = []
        for d in tt.dimensions:
            if d.WhichOneof("dimension") == "constant":
                dims.append(int(d.constant.size))
            else:
                dims.append(None)
        return ValueType("tensor", dtype, tuple(dims))
    if which == "stateType":
        inner = parse_value_type(vt.stateType.wrappedType)
        return ValueType("state", inner.dtype, inner.shape)
    return ValueType({"listType": "list", "tupleType": "tuple", "dictionaryType": "dict"}.get(which, str(which)))


@dataclass
class Arg:
    """One binding of an op input: a var name, a load-time value, or both (a const var)."""

    name: str | None
    value: Any = NO_VALUE

    @property
    def is_const(self) -> bool:
        return self.value is not NO_VALUE


@dataclass
class OpIR:
    type: str
    name: str
    inputs: dict[str, list[Arg]]
    outputs: list[tuple[str, ValueType]]
    blocks: list["BlockIR"] = field(default_factory=list)


@dataclass
class BlockIR:
    inputs: list[tuple[str, ValueType]]
    ops: list[OpIR]
    outputs: list[str]


@dataclass
class FunctionIR:
    name: str
    opset: str
    opset_version: int  # 15 (iOS15) .. 18 (iOS18)
    inputs: list[tuple[str, ValueType]]
    block: BlockIR
    var_types: dict[str, ValueType]
    consts: dict[str, Any]

    @property
    def output_types(self) -> list[ValueType]:
        return [self.var_types[n] for n in self.block.outputs]


def opset_version(opset: str) -> int:
    """``"CoreML7"`` -> 17 (the iOS version whose op definitions apply)."""
    digits = "".join(ch for ch in opset if ch.isdigit())
    if not opset.startswith("CoreML") or not digits:
        raise MilLoadError(f"unknown MIL opset {opset!r}")
    return int(digits) + 10


class _ValueReader:
    """Decodes protobuf ``Value``s; blob file values are read relative to ``weights_dir``."""

    def __init__(self, weights_dir: str | None):
        from coremltools.converters.mil.frontend.milproto import load as _milproto_load

        self._load = _milproto_load
        self._ctx = _milproto_load.TranscriptionContext(weights_dir or "")
        self.weights_dir = weights_dir
        # blob values shared by several functions (multifunction packages deduplicate
        # weights) are decoded once
        self._blobs: dict[tuple, Any] = {}

    def read(self, value_spec) -> Any:
        key = None
        if value_spec.WhichOneof("value") == "blobFileValue":
            if not self.weights_dir:
                raise MilLoadError("program references weight blobs but no weights directory is known")
            b = value_spec.blobFileValue
            key = (b.fileName, b.offset, value_spec.type.SerializeToString())
            if key in self._blobs:
                return self._blobs[key]
        try:
            val = self._load._load_value(self._ctx, value_spec)
        except MilLoadError:
            raise
        except Exception as exc:  # pragma: no cover - depends on malformed input
            raise MilLoadError(f"cannot decode value: {exc}") from exc
        if key is not None:
            self._blobs[key] = val
        return val


def parse_program(
    spec, weights_dir: str | None, package: str, problems: dict[str, list[str]] | None = None
) -> dict[str, FunctionIR]:
    """All functions of ``spec.mlProgram`` as IR (constants decoded, constexprs folded).

    constexpr ops that cannot be folded are recorded in ``problems`` (op type -> op
    names) so the caller can report them together with unsupported regular ops."""
    problems = {} if problems is None else problems
    if spec.WhichOneof("Type") != "mlProgram":
        raise MilLoadError(f"{package}: not an ML Program (model type {spec.WhichOneof('Type')!r})")
    reader = _ValueReader(weights_dir)
    functions = {}
    for fname, fspec in spec.mlProgram.functions.items():
        functions[fname] = _parse_function(fname, fspec, reader, package, problems)
    return functions


def _parse_function(fname, fspec, reader: _ValueReader, package: str, problems) -> FunctionIR:
    opset = fspec.opset
    if opset not in fspec.block_specializations:
        raise MilLoadError(f"{package}: function {fname!r} has no block for opset {opset}")
    version = opset_version(opset)
    var_types: dict[str, ValueType] = {}
    consts: dict[str, Any] = {}
    inputs = []
    for nvt in fspec.inputs:
        t = parse_value_type(nvt.type)
        inputs.append((nvt.name, t))
        var_types[nvt.name] = t
    block = _parse_block(fspec.block_specializations[opset], reader, var_types, consts, version, package, problems)
    return FunctionIR(fname, opset, version, inputs, block, var_types, consts)


def _parse_block(bspec, reader, var_types, consts, version, package, problems) -> BlockIR:
    from .errors import UnsupportedOpError
    from .ops.constexpr import evaluate_constexpr

    binputs = []
    for nvt in bspec.inputs:
        t = parse_value_type(nvt.type)
        binputs.append((nvt.name, t))
        var_types[nvt.name] = t
    ops: list[OpIR] = []
    for op_spec in bspec.operations:
        outputs = [(o.name, parse_value_type(o.type)) for o in op_spec.outputs]
        for oname, otype in outputs:
            var_types[oname] = otype
        name = outputs[0][0] if outputs else op_spec.type
        if op_spec.type == "const":
            if "val" not in op_spec.attributes:
                raise MilLoadError(f"{package}: const op {name!r} has no value")
            consts[name] = reader.read(op_spec.attributes["val"])
            continue
        inputs: dict[str, list[Arg]] = {}
        for pname, argument in op_spec.inputs.items():
            args = []
            for binding in argument.arguments:
                if binding.WhichOneof("binding") == "name":
                    args.append(Arg(binding.name, consts.get(binding.name, NO_VALUE)))
                else:
                    args.append(Arg(None, reader.read(binding.value)))
            inputs[pname] = args
        if op_spec.type.startswith("constexpr_"):
            params = {k: reader.read(v) for k, v in op_spec.attributes.items() if k != "name"}
            bad = [p for p, args in inputs.items() if len(args) != 1 or not args[0].is_const]
            if bad:
                problems.setdefault(f"{op_spec.type}: non-constant input {bad[0]!r}", []).append(name)
                continue
            params.update({p: args[0].value for p, args in inputs.items()})
            try:
                vals = evaluate_constexpr(op_spec.type, params, version, package, name)
            except UnsupportedOpError as exc:
                for key, names in exc.problems.items():
                    problems.setdefault(key, []).extend(names)
                continue
            if len(outputs) == 1:
                vals = (vals,)
            for (oname, _), val in zip(outputs, vals):
                consts[oname] = val
            continue
        blocks = [_parse_block(b, reader, var_types, consts, version, package, problems) for b in op_spec.blocks]
        ops.append(OpIR(op_spec.type, name, inputs, outputs, blocks))
    return BlockIR(binputs, ops, list(bspec.outputs))


def package_paths(package_path: str | os.PathLike) -> tuple[Path, Path, Path | None]:
    """(package dir, model spec file, weights dir) of an .mlpackage, without loading Core ML."""
    pkg = Path(package_path)
    if not pkg.exists():
        raise MilLoadError(f"{pkg}: no such package")
    if pkg.is_file():  # a bare .mlmodel (ML Programs need a package for weights)
        return pkg, pkg, None
    manifest = pkg / "Manifest.json"
    if not manifest.exists():
        raise MilLoadError(f"{pkg}: not an .mlpackage (no Manifest.json)")
    import json

    info = json.loads(manifest.read_text())
    items = info.get("itemInfoEntries", {})
    root = info.get("rootModelIdentifier")
    spec_file = None
    if root in items:
        spec_file = pkg / "Data" / items[root]["path"]
    else:  # pragma: no cover - unusual manifests
        candidates = sorted((pkg / "Data").rglob("*.mlmodel"))
        spec_file = candidates[0] if candidates else None
    if spec_file is None or not spec_file.exists():
        raise MilLoadError(f"{pkg}: model spec not found")
    weights = spec_file.parent / "weights"
    return pkg, spec_file, (weights if weights.is_dir() else None)


def load_spec(spec_file: Path):
    from coremltools.proto import Model_pb2

    spec = Model_pb2.Model()
    try:
        spec.ParseFromString(Path(spec_file).read_bytes())
    except Exception as exc:
        raise MilLoadError(f"{spec_file}: cannot parse model spec: {exc}") from exc
    return spec


__all__ = [
    "Arg",
    "BlockIR",
    "FunctionIR",
    "NO_VALUE",
    "OpIR",
    "ValueType",
    "load_spec",
    "package_paths",
    "parse_program",
    "parse_value_type",
]
