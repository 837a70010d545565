"""Inspect a saved .mlpackage and lint it statically against known ANE rules.

Also the multiply-accumulates of one call per op type, function and package (:mod:`anetts.compile.macs`).
Everything here reads the package's protobuf spec and the blob headers of its weight file;
nothing needs Core ML, so it runs on Linux.  The lint is a *static heuristic*: it flags graph
features that the sources below report as keeping work off the Neural Engine or breaking its
compiler.  Only a compute plan on a Mac (:func:`compute_plan`) shows where ops actually run.

Usage::

    info = inspect_package("x.mlpackage")        # dict, JSON-serialisable
    apply_lint_policy(info["lint"], ["flexible_shapes", "long_last_axis"])   # LintError

CLI (wired as ``anetts inspect``): ``python -m anetts.compile.inspect PKG [--json out.json]
[--fatal RULE ...] [--compute-plan UNITS]``.
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
import warnings
from collections import Counter
from pathlib import Path

from anetts.artifacts import atomic_file, tree_bytes
from anetts.compile.spec_walk import block_ops, function_ops, immediate_ints, program_ops, tensor_dims
from anetts.compile.macs import function_macs
from anetts.units import format_bytes, format_count

WIDTH_LIMIT = 16384
MAX_RANK = 5

# severity defaults; apply_lint_policy() decides what is fatal for a build
RULES = {
    "flexible_shapes": {
        "severity": "warn",
        "reason": "Flexible input shapes keep the program off the ANE: RangeDim ran 0 % on the ANE "
                  "(apple/coremltools#2370), 'MLE5Engine is not currently supported for models with "
                  "range shape inputs' (#1029), the ANE planner rejects FlexibleShapeInfo, and an "
                  "EnumeratedShapes duration package took 390 ms vs 13-51 ms fixed.",
        "source": "docs/ane-notes.md §2; docs/ane-notes.md §3; apple/coremltools#2370, #1029",
    },
    "rank_gt_5": {
        "severity": "warn",
        "reason": "The ANE supports tensors of rank <= 5; higher-rank ops fall back to GPU/CPU "
                  "(coremltools itself rejects rank > 5 at conversion, so this only fires on hand-built "
                  "or edited programs).",
        "source": "apple/ml-ane-transformers; docs/ane-notes.md §2",
    },
    "fp32_compute": {
        "severity": "warn",
        "reason": "The ANE computes in fp16/int8/int16 only; fp32 ops in an fp16 program fall back "
                  "to GPU/CPU and split the graph into extra segments.",
        "source": "docs/ane-notes.md §2; apple/ml-ane-transformers",
    },
    "ane_unfriendly_ops": {
        "severity": "warn",
        "reason": "Op types reported to leave the ANE or to break the ANE compiler (heuristic; "
                  "prove placement with a compute plan on a Mac).",
        "source": "docs/ane-notes.md §3; docs/ane-notes.md §2",
    },
    "long_last_axis": {
        "severity": "warn",
        "reason": "ANE tensor width limit: 'Tensor width goes beyond limit supported (16390 > 16384)'; "
                  "ops on such tensors do not compile for the ANE.",
        "source": "docs/ane-notes.md §2; docs/ane-notes.md §3",
    },
    "dynamic_gather": {
        "severity": "warn",
        "reason": "Gathers with runtime indices stay on the CPU, forcing a device round trip.",
        "source": "docs/ane-notes.md §2",
    },
}

# op type -> (severity, why, source).  A heuristic list, see RULES["ane_unfriendly_ops"].
UNFRIENDLY_OPS = {
    "lstm": ("warn", "recurrent op; LSTMs land on the CPU", "docs/ane-notes.md §3"),
    "gru": ("warn", "recurrent op; runs on the CPU like lstm", "docs/ane-notes.md §3, by analogy"),
    "rnn": ("warn", "recurrent op; runs on the CPU like lstm", "docs/ane-notes.md §3, by analogy"),
    # info, not warn: the ports whose generator failed to compile also had ×10/×6 conv_transpose and
    # axes over 16,384, and an ANE vocoder graph that compiles carries Snake's sin (docs/ane-notes.md §8)
    "sin": ("info", "named among the causes of 'MILCompilerForANE error: failed to compile ANE model' for the "
                    "Kokoro generator, beside conv_transpose x10/x6 and axes over 16,384; a Snake vocoder on the "
                    "ANE carries it. Where it turns a phase into a spectrum (the iSTFT tail) fp16 is too coarse",
            "docs/ane-notes.md §3, §8"),
    "cos": ("warn", "same family as sin (phase tails need fp32)", "docs/ane-notes.md §3, by analogy"),
    "exp": ("info", "fp16 overflow hazard: exp(11.1) already exceeds 65504; the ANE falls back silently",
            "docs/ane-notes.md §3"),
    "while_loop": ("warn", "control flow is not ANE work", "heuristic"),
    "cond": ("warn", "control flow is not ANE work", "heuristic"),
    "non_zero": ("warn", "data-dependent output shape", "heuristic; docs/ane-notes.md §2"),
    "random_uniform": ("warn", "random ops are CPU-only (move noise sources to the host)", "docs/ane-notes.md §1"),
    "random_normal": ("warn", "random ops are CPU-only (move noise sources to the host)", "docs/ane-notes.md §1"),
    "random_bernoulli": ("warn", "random ops are CPU-only", "docs/ane-notes.md §1"),
    "random_categorical": ("warn", "random ops are CPU-only", "docs/ane-notes.md §1"),
    "scaled_dot_product_attention": ("info", "no fused SDPA on the ANE; per-head einsum is the ANE form",
                                     "docs/ane-notes.md §2"),
}
# conv_transpose is flagged only with a stride > 2 (the Kokoro generator's x10/x6 upsampling)
LARGE_STRIDE = 2

GATHER_OPS = ("gather", "gather_nd", "gather_along_axis")
NON_COMPUTE = {"const", "cast"}

_BLOB_DTYPES = {1: "float16", 2: "float32", 3: "uint8", 4: "int8", 5: "bfloat16", 6: "int16",
                7: "uint16", 8: "int4", 9: "uint1", 10: "uint2", 11: "uint4", 12: "uint3",
                13: "uint6", 14: "int32", 15: "uint32"}
_BLOB_SENTINEL = 0xDEADBEEF


class LintError(RuntimeError):
    pass


def _ct():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import coremltools as ct
    return ct


# --------------------------------------------------------------------------------------------
# package layout and weight blobs


def package_files(path) -> tuple[Path, Path, Path | None]:
    """(package dir, model spec file, weights dir or None), read from Manifest.json."""
    pkg = Path(path)
    manifest = pkg / "Manifest.json"
    if not manifest.is_file():
        raise FileNotFoundError(f"{pkg}: not an .mlpackage (no Manifest.json)")
    info = json.loads(manifest.read_text(encoding="utf-8"))
    items = info.get("itemInfoEntries", {})
    root = info.get("rootModelIdentifier")
    spec_file = pkg / "Data" / items[root]["path"] if root in items else None
    if spec_file is None or not spec_file.is_file():
        raise FileNotFoundError(f"{pkg}: model spec not found")
    weights = spec_file.parent / "weights"
    return pkg, spec_file, (weights if weights.is_dir() else None)


def load_spec(path):
    from coremltools.proto import Model_pb2

    from google.protobuf.message import DecodeError

    _, spec_file, _ = package_files(path)
    spec = Model_pb2.Model()
    try:
        spec.ParseFromString(spec_file.read_bytes())
    except DecodeError as e:
        raise ValueError(f"{spec_file}: not a readable Core ML model spec (truncated or corrupted: {e})") from None
    return spec


class BlobFile:
    """Reads the per-blob headers of a MIL weight file (sentinel, dtype, size, data offset)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fh = open(self.path, "rb")
        self.size = self.path.stat().st_size

    def close(self):
        self._fh.close()

    def header(self, offset: int) -> tuple[str, int, int]:
        self._fh.seek(offset)
        raw = self._fh.read(24)
        if len(raw) < 24:
            raise ValueError(f"{self.path}: truncated ({self.size} bytes): the blob header at offset {offset} is cut off")
        sentinel, dtype, nbytes, data_offset = struct.unpack("<IIQQ", raw)
        if sentinel != _BLOB_SENTINEL:
            raise ValueError(f"{self.path}: no blob header at offset {offset}")
        if data_offset + nbytes > self.size:
            raise ValueError(f"{self.path}: truncated ({self.size} bytes): the blob at offset {offset} "
                             f"needs bytes up to {data_offset + nbytes}")
        return _BLOB_DTYPES.get(dtype, f"blob_dtype_{dtype}"), nbytes, data_offset

    def data(self, offset: int) -> bytes:
        _, nbytes, data_offset = self.header(offset)
        self._fh.seek(data_offset)
        return self._fh.read(nbytes)


def fp16_bytes(dtype: str, nbytes: int) -> int:
    """Bytes the tensor takes as fp16: fp32/fp64 halve/quarter, other (compressed) types as is."""
    if dtype == "float32":
        return nbytes // 2
    if dtype == "float64":
        return nbytes // 4
    return nbytes


def _resolve_blob_path(file_name: str, spec_dir: Path) -> Path:
    # fileName looks like "@model_path/weights/weight.bin", relative to the spec's folder
    return spec_dir / file_name.replace("@model_path/", "")


def _iter_values(op):
    """(where, Value) for every literal value of an op: attributes and inline input values."""
    for k, v in op.attributes.items():
        yield k, v
    for k, arg in op.inputs.items():
        for b in arg.arguments:
            if b.WhichOneof("binding") == "value":
                yield k, b.value


_MIL_DTYPE_BYTES = {"FLOAT16": 2, "FLOAT32": 4, "FLOAT64": 8, "BFLOAT16": 2, "INT8": 1, "UINT8": 1,
                    "INT16": 2, "UINT16": 2, "INT32": 4, "UINT32": 4, "INT64": 8, "UINT64": 8, "BOOL": 1}


def _mil_dtype_name(code: int) -> str:
    from coremltools.proto import MIL_pb2

    try:
        return MIL_pb2.DataType.Name(code)
    except ValueError:
        return str(code)


def op_counts(spec) -> dict[str, dict[str, int]]:
    """Per function: op type -> count (`program_ops`), sorted by type."""
    out: dict[str, dict[str, int]] = {fname: {} for fname in spec.mlProgram.functions}
    for fname, op in program_ops(spec):
        out[fname][op.type] = out[fname].get(op.type, 0) + 1
    return {f: dict(sorted(c.items())) for f, c in out.items()}


def function_weights(spec, spec_dir: Path) -> dict[str, dict]:
    """Per function: {"blobs": {(file, offset): (dtype, nbytes)}, "inline_bytes": n}."""
    out = {}
    for fname, fn in spec.mlProgram.functions.items():
        blobs, inline = {}, 0
        for op in function_ops(fn):
            for _, val in _iter_values(op):
                kind = val.WhichOneof("value")
                if kind == "blobFileValue":
                    key = (val.blobFileValue.fileName, int(val.blobFileValue.offset))
                    blobs[key] = None
                elif kind == "immediateValue" and op.type == "const":
                    inline += _immediate_bytes(val)
        out[fname] = {"blobs": blobs, "inline_bytes": inline}
    readers: dict[str, BlobFile] = {}
    try:
        for info in out.values():
            for key in list(info["blobs"]):
                fname = key[0]
                if fname not in readers:
                    readers[fname] = BlobFile(_resolve_blob_path(fname, spec_dir))
                dtype, nbytes, _ = readers[fname].header(key[1])
                info["blobs"][key] = (dtype, nbytes)
    finally:
        for r in readers.values():
            r.close()
    return out


def _immediate_bytes(val) -> int:
    if val.type.WhichOneof("type") != "tensorType":
        return 0
    tt = val.type.tensorType
    n = 1
    for d in tensor_dims(tt):
        n *= d or 0
    return n * _MIL_DTYPE_BYTES.get(_mil_dtype_name(tt.dataType), 4)


# --------------------------------------------------------------------------------------------
# I/O description


def _feature(f) -> dict:
    from coremltools.proto import FeatureTypes_pb2

    kind = f.type.WhichOneof("Type")
    d = {"name": f.name, "kind": kind}
    if kind == "multiArrayType":
        arr = f.type.multiArrayType
        d["shape"] = [int(x) for x in arr.shape]
        d["dtype"] = FeatureTypes_pb2.ArrayFeatureType.ArrayDataType.Name(arr.dataType).lower()
        flex = arr.WhichOneof("ShapeFlexibility")
        if flex == "enumeratedShapes":
            d["flexible"] = {"enumerated": [[int(x) for x in s.shape] for s in arr.enumeratedShapes.shapes]}
        elif flex == "shapeRange":
            d["flexible"] = {"range": [[int(r.lowerBound), int(r.upperBound)] for r in arr.shapeRange.sizeRanges]}
    elif kind == "stateType":
        arr = f.type.stateType.arrayType
        d["shape"] = [int(x) for x in arr.shape]
        d["dtype"] = FeatureTypes_pb2.ArrayFeatureType.ArrayDataType.Name(arr.dataType).lower()
    elif kind == "imageType":
        im = f.type.imageType
        d["shape"] = [int(im.height), int(im.width)]
        d["dtype"] = "image"
    if f.shortDescription:
        d["description"] = f.shortDescription
    return d


def function_io(spec) -> dict[str, dict]:
    """Per function name: {"inputs": [...], "outputs": [...], "states": [...]}."""
    desc = spec.description
    if len(desc.functions) == 0:
        return {"main": {"inputs": [_feature(f) for f in desc.input],
                         "outputs": [_feature(f) for f in desc.output],
                         "states": [_feature(f) for f in desc.state]}}
    return {fd.name: {"inputs": [_feature(f) for f in fd.input], "outputs": [_feature(f) for f in fd.output],
                      "states": [_feature(f) for f in fd.state]} for fd in desc.functions}


def deployment_targets(spec_version: int) -> list[str]:
    ct = _ct()
    return [n for n, m in ct.target.__members__.items() if m.value == spec_version]


# --------------------------------------------------------------------------------------------
# lint


def _finding(rule: str, count: int, message: str, function: str, severity: str | None = None,
             reason: str | None = None, source: str | None = None, **extra) -> dict:
    r = RULES[rule]
    return {"rule": rule, "severity": severity or r["severity"], "message": message, "count": int(count),
            "reason": reason or r["reason"], "source": source or r["source"], "function": function, **extra}


def lint_function(fname: str, fn, io: dict, fp16_program: bool) -> list[dict]:
    """Static ANE lint of one MIL function (protobuf) plus its I/O description."""
    findings: list[dict] = []

    # flexible shapes: description flexibility or unknown dims on MIL inputs
    flex = [f["name"] for f in io.get("inputs", []) if f.get("flexible")]
    for inp in fn.inputs:
        if inp.type.WhichOneof("type") == "tensorType":
            if None in tensor_dims(inp.type.tensorType) and inp.name not in flex:
                flex.append(inp.name)
    if flex:
        findings.append(_finding("flexible_shapes", len(flex), f"{len(flex)} input(s) with flexible shapes: {flex}",
                                 fname, inputs=flex))

    ops = function_ops(fn)
    producers = {}
    for op in ops:
        for o in op.outputs:
            producers[o.name] = op.type

    high_rank, wide, fp32_ops = Counter(), [], Counter()
    unfriendly: Counter = Counter()
    big_stride: list[str] = []
    dyn_gather = Counter()
    max_width = 0
    for inp in fn.inputs:
        if inp.type.WhichOneof("type") == "tensorType":
            dims = tensor_dims(inp.type.tensorType)
            if dims and dims[-1] is not None and dims[-1] > WIDTH_LIMIT:
                wide.append(f"input {inp.name} {dims}")
    consts = {}
    for op in ops:
        if op.type == "const" and "val" in op.attributes and op.outputs:
            consts[op.outputs[0].name] = op.attributes["val"]

    def param(op, key):
        """An op parameter's literal Value: attribute, inline input value, or a const's value."""
        if key in op.attributes:
            return op.attributes[key]
        if key in op.inputs:
            for b in op.inputs[key].arguments:
                kind = b.WhichOneof("binding")
                if kind == "value":
                    return b.value
                if kind == "name" and b.name in consts:
                    return consts[b.name]
        return None

    for op in ops:
        t = op.type
        is_rank_gt, is_fp32 = False, False
        for o in op.outputs:
            if o.type.WhichOneof("type") != "tensorType":
                continue
            tt = o.type.tensorType
            if int(tt.rank) > MAX_RANK:
                is_rank_gt = True
            dims = tensor_dims(tt)
            if t != "const" and dims and dims[-1] is not None and dims[-1] > WIDTH_LIMIT:
                wide.append(f"{t} {o.name} {dims}")
                max_width = max(max_width, dims[-1])
            if (fp16_program and t not in NON_COMPUTE and not t.startswith("constexpr_")
                    and _mil_dtype_name(tt.dataType) == "FLOAT32"):
                is_fp32 = True
        high_rank[t] += is_rank_gt
        fp32_ops[t] += is_fp32
        if t in UNFRIENDLY_OPS:
            unfriendly[t] += 1
        if t == "conv_transpose":
            val = param(op, "strides")
            strides = immediate_ints(val) if val is not None else []
            if any(s > LARGE_STRIDE for s in strides):
                big_stride.append(f"{op.outputs[0].name if op.outputs else '?'} strides={strides}")
        if t in GATHER_OPS and "indices" in op.inputs:
            for b in op.inputs["indices"].arguments:
                if b.WhichOneof("binding") == "name" and producers.get(b.name) != "const" and \
                        not str(producers.get(b.name, "")).startswith("constexpr_"):
                    dyn_gather[t] += 1

    high_rank = +high_rank  # drop zero counts
    fp32_ops = +fp32_ops
    if high_rank:
        n = sum(high_rank.values())
        findings.append(_finding("rank_gt_5", n, f"{n} op output(s) of rank > {MAX_RANK}: {dict(high_rank)}",
                                 fname, op_types=dict(high_rank)))
    if fp32_ops:
        n = sum(fp32_ops.values())
        findings.append(_finding("fp32_compute", n, f"{n} fp32 compute op(s) in an fp16 program: {dict(fp32_ops)}",
                                 fname, op_types=dict(fp32_ops)))
    for t, n in sorted(unfriendly.items()):
        sev, why, src = UNFRIENDLY_OPS[t]
        findings.append(_finding("ane_unfriendly_ops", n, f"{n} {t} op(s): {why}", fname, severity=sev,
                                 reason=f"{why} (heuristic)", source=src, op_type=t))
    if big_stride:
        findings.append(_finding(
            "ane_unfriendly_ops", len(big_stride),
            f"{len(big_stride)} conv_transpose op(s) with stride > {LARGE_STRIDE}: {big_stride[:4]}", fname,
            reason="conv_transpose upsampling (x10/x6 in the Kokoro generator) is named among the causes of "
                   "'MILCompilerForANE error: failed to compile ANE model'; keep strides small, in factors of 2 "
                   "or 3 (heuristic)",
            source="docs/ane-notes.md §3; docs/ane-notes.md §2", op_type="conv_transpose"))
    if wide:
        findings.append(_finding("long_last_axis", len(wide),
                                 f"{len(wide)} tensor(s) with last axis > {WIDTH_LIMIT} (widest {max_width}): {wide[:4]}",
                                 fname, max_width=max_width))
    if dyn_gather:
        n = sum(dyn_gather.values())
        findings.append(_finding("dynamic_gather", n, f"{n} gather op(s) with runtime indices: {dict(dyn_gather)}",
                                 fname, op_types=dict(dyn_gather)))
    return findings


def apply_lint_policy(findings: list[dict], fatal_rules) -> None:
    """Raise LintError if any finding's rule is configured fatal (or the finding itself is fatal).

    Unknown rule names in ``fatal_rules`` are an error too (a typo must not disable a gate).
    """
    fatal_rules = list(fatal_rules or [])
    unknown = [r for r in fatal_rules if r not in RULES]
    if unknown:
        raise LintError(f"unknown lint rule(s) {unknown}; known: {sorted(RULES)}")
    bad = [f for f in findings if f["rule"] in fatal_rules or f.get("severity") == "fatal"]
    if bad:
        lines = [f"[{f['rule']}] {f.get('function', '')}: {f['message']} -- {f['reason']} ({f['source']})" for f in bad]
        raise LintError(f"{len(bad)} fatal lint finding(s):\n" + "\n".join(lines))


# --------------------------------------------------------------------------------------------
# inspect


def _histogram(ops) -> dict[str, int]:
    return dict(sorted(Counter(op.type for op in ops).items()))


def inspect_package(path) -> dict:
    """Everything static about a package: see the module docstring."""

    pkg, spec_file, weights_dir = package_files(path)
    spec = load_spec(pkg)
    if spec.WhichOneof("Type") != "mlProgram":
        raise ValueError(f"{pkg}: not an ML Program ({spec.WhichOneof('Type')})")
    meta = spec.description.metadata
    user = dict(meta.userDefined)
    io = function_io(spec)
    weights = function_weights(spec, spec_file.parent)
    fp16_hint = user.get("anetts.precision")

    weight_files = {}
    if weights_dir is not None:
        weight_files = {p.name: p.stat().st_size for p in sorted(weights_dir.iterdir()) if p.is_file()}
    total_bytes = tree_bytes(pkg)

    functions, all_findings = {}, []
    unique_blobs: dict = {}
    order = [f for f in io if f in spec.mlProgram.functions]
    order += [f for f in spec.mlProgram.functions if f not in order]
    for fname in order:
        fn = spec.mlProgram.functions[fname]
        ops = function_ops(fn)
        hist = _histogram(ops)
        if fp16_hint is not None:
            fp16_program = fp16_hint == "fp16"
        else:  # no metadata: an fp16 program is one that computes anything in fp16
            fp16_program = any(o.type.WhichOneof("type") == "tensorType"
                               and _mil_dtype_name(o.type.tensorType.dataType) == "FLOAT16"
                               for op in ops if op.type not in NON_COMPUTE for o in op.outputs)
        w = weights[fname]
        unique_blobs.update(w["blobs"])
        blob_bytes = sum(n for _, n in w["blobs"].values())
        findings = lint_function(fname, fn, io.get(fname, {}), fp16_program)
        all_findings.extend(findings)
        functions[fname] = {
            "opset": fn.opset,
            **io.get(fname, {"inputs": [], "outputs": [], "states": []}),
            "ops": hist,
            "op_count": sum(hist.values()),
            "weight_bytes": blob_bytes + w["inline_bytes"],
            "weight_bytes_blob": blob_bytes,
            "weight_bytes_inline": w["inline_bytes"],
            "weight_blobs": len(w["blobs"]),
            "weight_bytes_fp16": sum(fp16_bytes(d, n) for d, n in w["blobs"].values()),
            "weight_dtypes": dict(Counter(d for d, _ in w["blobs"].values())),
            "fp16_program": fp16_program,
            # multiply-accumulates of one call, from the declared shapes (anetts.compile.macs)
            "macs": function_macs(fn),
            "lint": findings,
        }
    spec_version = int(spec.specificationVersion)
    return {
        "package": str(pkg),
        "bytes": total_bytes,
        "weight_files": weight_files,
        "weight_bytes_unique": sum(n for _, n in unique_blobs.values()),
        "weight_bytes_fp16_unique": sum(fp16_bytes(d, n) for d, n in unique_blobs.values()),
        "specification_version": spec_version,
        "deployment_target": next((t for t in deployment_targets(spec_version) if t.startswith("macOS")), None),
        "deployment_targets": deployment_targets(spec_version),
        "default_function": spec.description.defaultFunctionName or "main",
        "metadata": {"user_defined": user, "author": meta.author, "license": meta.license,
                     "short_description": meta.shortDescription, "version": meta.versionString},
        "functions": functions,
        # one call of every function (a package of several: each called once)
        "macs": package_macs(functions),
        "lint": all_findings,
    }


def package_macs(functions: dict) -> dict:
    """{"total", "by_op"}: the MACs of `inspect_package`'s functions summed (one call of each)."""
    by_op: Counter = Counter()
    for f in functions.values():
        by_op.update(f["macs"]["by_op"])
    return {"total": sum(by_op.values()), "by_op": dict(sorted(by_op.items()))}


# --------------------------------------------------------------------------------------------
# compute plan (macOS only)


def compute_plan(path, compute_units: str = "CPU_AND_NE") -> dict:
    """Per-op device usage from Core ML's MLComputePlan (macOS 14.4+).

    Returns {function: {"ops": [{op, outputs, preferred, supported, cost}], "by_device": {dev: n},
    "cost_by_device": {dev: w}}}.  Raises RuntimeError off macOS.
    """
    if sys.platform != "darwin":
        raise RuntimeError("MLComputePlan needs macOS (14.4+) with Core ML; it cannot run on "
                           f"{sys.platform}. Run `anetts inspect --compute-plan` on a Mac.")
    ct = _ct()
    from coremltools.models.compute_plan import MLComputePlan

    units = ct.ComputeUnit[compute_units]
    compiled = ct.models.utils.compile_model(str(path))
    plan = MLComputePlan.load_from_path(compiled, compute_units=units)
    program = plan.model_structure.program
    if program is None:
        raise RuntimeError(f"{path}: not an ML Program")

    def device_name(dev) -> str:
        n = type(dev).__name__
        return {"MLCPUComputeDevice": "CPU", "MLGPUComputeDevice": "GPU",
                "MLNeuralEngineComputeDevice": "ANE"}.get(n, n)

    out = {}
    for fname, fn in program.functions.items():
        rows, by_dev, cost_dev = [], Counter(), Counter()

        for op in block_ops(fn.block):  # the compute plan's blocks nest like the spec's
            usage = plan.get_compute_device_usage_for_mlprogram_operation(op)
            cost = plan.get_estimated_cost_for_mlprogram_operation(op)
            pref = device_name(usage.preferred_compute_device) if usage else None
            row = {"op": op.operator_name, "outputs": [o.name for o in op.outputs],
                   "preferred": pref,
                   "supported": [device_name(d) for d in usage.supported_compute_devices] if usage else [],
                   "cost": float(cost.weight) if cost else None}
            rows.append(row)
            if pref and op.operator_name != "const":
                by_dev[pref] += 1
                cost_dev[pref] += row["cost"] or 0.0
        n = sum(by_dev.values()) or 1
        out[fname] = {"compute_units": compute_units, "ops": rows, "by_device": dict(by_dev),
                      "cost_by_device": dict(cost_dev), "ane_op_fraction": by_dev.get("ANE", 0) / n}
    return out


# --------------------------------------------------------------------------------------------
# CLI


def _macs_line(macs: dict) -> str:
    """`1.25 G (conv 1.20 G, matmul 50.0 M)`: a `function_macs` / `package_macs` result, largest first."""
    top = sorted(macs["by_op"].items(), key=lambda kv: -kv[1])
    return format_count(macs["total"]) + (" (" + ", ".join(f"{k} {format_count(v)}" for k, v in top) + ")" if top else "")


def summary(info: dict) -> str:
    lines = [f"{info['package']}",
             f"  spec v{info['specification_version']} ({'/'.join(info['deployment_targets'][:2])}), "
             f"{format_bytes(info['bytes'])} on disk, unique weights {format_bytes(info['weight_bytes_unique'])}, "
             f"default function {info['default_function']}"]
    ud = info["metadata"]["user_defined"]
    keys = [k for k in ("anetts.model", "anetts.stage", "anetts.bucket", "anetts.precision",
                        "anetts.compute_units", "anetts.linear_rewrite") if k in ud]
    if keys:
        lines.append("  " + ", ".join(f"{k.split('.', 1)[1]}={ud[k]}" for k in keys))
    for fname, f in info["functions"].items():
        lines.append(f"  function {fname} ({f['opset']}): {f['op_count']} ops, weights {format_bytes(f['weight_bytes'])}")
        for kind in ("inputs", "outputs"):
            for t in f[kind]:
                flex = f" flexible={t['flexible']}" if t.get("flexible") else ""
                lines.append(f"    {kind[:-1]:6s} {t['name']}: {t.get('dtype')} {t.get('shape')}{flex}")
        top = sorted(f["ops"].items(), key=lambda kv: -kv[1])
        lines.append("    ops: " + ", ".join(f"{k} {v}" for k, v in top if k != "const")
                     + f" (+{f['ops'].get('const', 0)} const)")
        lines.append(f"    MACs: {_macs_line(f['macs'])}")
    if len(info["functions"]) > 1:
        lines.append(f"  MACs, one call of each function: {_macs_line(info['macs'])}")
    if info["lint"]:
        lines.append(f"  lint: {len(info['lint'])} finding(s)")
        for x in info["lint"]:
            lines.append(f"    {x['severity']:5s} {x['rule']} [{x['function']}]: {x['message']}")
            lines.append(f"          why: {x['reason']} ({x['source']})")
    else:
        lines.append("  lint: clean")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="anetts inspect",
                                description="Summarize an .mlpackage and lint it against static ANE rules.")
    p.add_argument("package", type=Path)
    p.add_argument("--json", type=Path, default=None, help="also write the full report as JSON here")
    p.add_argument("--fatal", action="append", default=[], metavar="RULE",
                   help=f"exit 2 if this rule fires (repeatable; one of {sorted(RULES)})")
    p.add_argument("--compute-plan", metavar="UNITS", default=None,
                   help="macOS only: add MLComputePlan device usage for these compute units "
                        "(CPU_ONLY, CPU_AND_GPU, CPU_AND_NE, ALL)")
    args = p.parse_args(argv)
    try:
        info = inspect_package(args.package)
    except (FileNotFoundError, ValueError) as e:
        print(f"anetts inspect: {e}", file=sys.stderr)
        return 1
    if args.compute_plan:
        try:
            info["compute_plan"] = compute_plan(args.package, args.compute_plan)
        except RuntimeError as e:
            print(f"anetts inspect: {e}", file=sys.stderr)
            return 1
    print(summary(info))
    if "compute_plan" in info:
        for fname, cp in info["compute_plan"].items():
            print(f"  compute plan {fname} ({cp['compute_units']}): ops by device {cp['by_device']}, "
                  f"ANE op fraction {cp['ane_op_fraction']:.2f}")
    if args.json:
        try:
            with atomic_file(args.json) as tmp:
                tmp.write_text(json.dumps(info, indent=2, default=str) + "\n", encoding="utf-8")
        except OSError as e:
            print(f"anetts inspect: cannot write {args.json}: {e}", file=sys.stderr)
            return 1
    try:
        apply_lint_policy(info["lint"], args.fatal)
    except LintError as e:
        print(f"anetts inspect: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
