"""Convert one exported stage/bucket (TorchScript) into an ML Program .mlpackage.

mlprogram, fp16 compute, fp32/int32 I/O (a TensorType without dtype becomes fp16 I/O at
macOS14+, docs/ane-notes.md §1), per-stage deployment target, descriptions and metadata.
The package is written to a temporary path, re-read and checked, then moved into place, so a
conversion that fails half-way leaves no package behind.

A function may declare states (`FunctionSpec.states`, fp16 buffers such as a KV cache): each is
a `register_buffer` of the traced module with the same name, updated in place by the forward;
coremltools turns it into a `ct.StateType` (read_state / slice_update / write_state in MIL).
States need macOS15 / iOS18 (specification 9).

Mixed precision (`ConvertOptions.fp32_ops`): in an fp16 program the selected ops compute in fp32
(coremltools' `FP16ComputePrecision(op_selector=...)`, which casts at their boundaries); see `Fp32Ops`.
"""
from __future__ import annotations

import json
import logging
import shutil
import time
import warnings
from collections import Counter
from pathlib import Path


from anetts.artifacts import atomic_outputs, clear_outputs, tree_bytes, tree_sha256, write_json
from anetts.compile.inspect import apply_lint_policy, inspect_package
from anetts.compile.pipeline_trims import program_text_skipped, validated_once
from anetts.compile.reproducible import stabilize_package
from anetts.compile.rewrite import LinearRewrite
from anetts.compile.stamp import package_stamp
from anetts.options import ConvertOptions  # noqa: F401 - re-exported: callers build options here
from anetts.provenance import provenance
from anetts.tensors import DTYPES, FunctionSpec, StateSpec

log = logging.getLogger(__name__)

PRECISIONS = ("fp16", "fp32")
STATE_MIN_TARGET = "macOS15"  # first target with ct.StateType (iOS18, specification 9)


class ConversionError(RuntimeError):
    pass


FP32_SELECTOR_KINDS = ("module", "op", "name")


class Fp32Ops:
    """The `fp32_ops` op selectors of a stage, as the op_selector of coremltools' fp16 pass.

    * ``module:<path>``: every op traced inside that torch submodule: `path` (dotted for nested
      calls, e.g. ``istft``) is a run of the op's TorchScript module-name scope, the attribute
      names of the submodules the trace entered (coremltools records them on each MIL op); or an
      op that reads a parameter of that submodule (``noise_convs.1.weight``: a ModuleList entry
      called from its parent's forward is scoped by its index alone);
    * ``op:<type>``: every op of that MIL type (``exp``);
    * ``name:<name>``: the MIL op of that name as the fp16 pass sees it (names come from the
      torch trace and change with the model's size: prefer ``module:``).

    ``const`` ops are not counted (a const consumed in fp32 stays fp32 anyway). A selector that
    matches no op is a ConversionError naming the key: a typo must not silently give an all-fp16
    program. The fp16 pass runs once per conversion; `matched` holds what each selector selected.
    """

    def __init__(self, selectors, precision: str, where: str):
        self.where = where
        self.selectors: list[tuple[str, str, str]] = []
        for sel in selectors or ():
            kind, _, value = str(sel).partition(":")
            if kind not in FP32_SELECTOR_KINDS or not value:
                raise ConversionError(f"{where}: fp32_ops selector {sel!r} is not one of "
                                      f"{[k + ':...' for k in FP32_SELECTOR_KINDS]}")
            self.selectors.append((sel, kind, value))
        if self.selectors and precision != "fp16":
            raise ConversionError(f"{where}: fp32_ops {[s for s, _, _ in self.selectors]} need precision fp16 "
                                  f"(the program is {precision} already)")
        self.matched: dict[str, Counter] = {s: Counter() for s, _, _ in self.selectors}

    def compute_precision(self, ct, precision: str):
        """The `compute_precision` argument of ct.convert."""
        if not self.selectors:
            return ct.precision.FLOAT16 if precision == "fp16" else ct.precision.FLOAT32
        return ct.transform.FP16ComputePrecision(op_selector=self._fp16)

    @staticmethod
    def _modules(op) -> list[str]:
        from coremltools.converters.mil.mil.scope import ScopeSource

        names = op.scopes.get(ScopeSource.TORCHSCRIPT_MODULE_NAME) or []
        return list(names[:-1])  # the last entry is the torch node's own name

    @staticmethod
    def _input_vars(op):
        for v in op.inputs.values():
            yield from (v if isinstance(v, (list, tuple)) else (v,))

    def _matches(self, op, kind: str, value: str) -> bool:
        if kind == "op":
            return op.op_type == value
        if kind == "name":
            return op.name == value
        path, mods = value.split("."), self._modules(op)
        if any(mods[i:i + len(path)] == path for i in range(len(mods) - len(path) + 1)):
            return True
        # a submodule called from a parent's forward by index (ModuleList) is scoped by its own
        # attribute name only ("1"); its parameters keep their full path ("noise_convs.1.weight")
        return any(v.op is not None and v.op.op_type == "const" and v.name.startswith(value + ".")
                   for v in self._input_vars(op))

    def _fp16(self, op) -> bool:
        """op_selector: True = cast to fp16, False = keep fp32."""
        if op.op_type == "const":
            return True
        keep = False
        for sel, kind, value in self.selectors:
            if self._matches(op, kind, value):
                self.matched[sel][op.op_type] += 1
                keep = True
        return not keep

    def check(self) -> None:
        unmatched = [s for s, c in self.matched.items() if not c]
        if unmatched:
            raise ConversionError(f"{self.where}: fp32_ops selector(s) {unmatched} matched no op of the program "
                                  f"(config key fp32_ops; module: names a torch submodule the trace entered, "
                                  f"op: a MIL op type, name: a MIL op name)")

    def report(self) -> dict:
        return {s: dict(sorted(c.items())) for s, c in self.matched.items()}


def _ct():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import coremltools as ct
    return ct


def package_io(package: Path) -> dict:
    """Names, shapes and dtypes of a saved package's inputs and outputs, read from its spec."""
    ct = _ct()
    spec = ct.utils.load_spec(str(package))
    dtype_names = {65552: "float16", 65568: "float32", 131104: "int32", 65600: "float64"}

    def describe(features):
        out = []
        for f in features:
            arr = f.type.multiArrayType
            out.append({"name": f.name, "shape": [int(d) for d in arr.shape],
                        "dtype": dtype_names.get(arr.dataType, str(arr.dataType))})
        return out

    io = {"inputs": describe(spec.description.input), "outputs": describe(spec.description.output),
          "functions": [f.name for f in spec.description.functions] or ["main"],
          "specification_version": spec.specificationVersion}
    if len(spec.description.state):  # only stateful packages carry the key
        io["states"] = [{"name": f.name, "shape": [int(d) for d in f.type.stateType.arrayType.shape],
                         "dtype": dtype_names.get(f.type.stateType.arrayType.dataType,
                                                  str(f.type.stateType.arrayType.dataType))}
                        for f in spec.description.state]
    return io


def state_types(states, deployment_target: str, where: str) -> list:
    """`ct.StateType`s for `states`; a ConversionError naming `where` if the target predates states."""
    if not states:
        return []
    ct = _ct()
    try:
        target = getattr(ct.target, deployment_target)
    except AttributeError:
        raise ConversionError(f"{where}: unknown deployment target {deployment_target!r}") from None
    if target < getattr(ct.target, STATE_MIN_TARGET):
        raise ConversionError(f"{where}: states {[t.name for t in states]} need deployment_target "
                              f"{STATE_MIN_TARGET} (iOS18) or later, got {deployment_target}")
    out = []
    for t in states:
        if not isinstance(t, StateSpec):
            raise ConversionError(f"{where}: state {t.name} must be a StateSpec (fp16), got {type(t).__name__}")
        out.append(ct.StateType(wrapped_type=ct.TensorType(shape=t.shape, dtype=t.np_dtype), name=t.name))
    return out


def convert_export(functions_dir: Path, export_json: Path, out_package: Path, out_report: Path,
                   options: ConvertOptions, model_meta: dict, out_inspect: Path | None = None) -> dict:
    """Rule `convert`: an export's functions folder (`artifacts.export_files`) as its package.
    `model_meta`: model, family, source, revision.

    `out_inspect`: also write the package's inspect JSON (`anetts inspect --json`); the walk is
    needed here anyway for the lint, and a separate job per package would re-import coremltools.
    """
    export = json.loads(Path(export_json).read_text(encoding="utf-8"))
    stage, bucket, geometry = export["stage"], export["bucket"], export["geometry"]
    functions = [FunctionSpec.from_json(f) for f in export["functions"]]
    if len(functions) == 1:
        # one function is converted straight into the package: merging it (`convert_functions`)
        # would raise its specification version and restamp it, other bytes for the same program
        (fn,) = functions
        return convert_function(Path(functions_dir) / f"{fn.name}.pt", fn, out_package, out_report, options,
                                model_meta, stage=stage, bucket=bucket, geometry=geometry, out_inspect=out_inspect)
    return _convert_multifunction(functions_dir, functions, stage, bucket, geometry, out_package, out_report,
                                  options, model_meta, out_inspect)


def convert_function(torchscript: Path, function: FunctionSpec, out_package: Path, out_report: Path,
                     options: ConvertOptions, model_meta: dict, stage: str, geometry: dict | None = None,
                     out_inspect: Path | None = None, bucket: str | None = None,
                     fp32_ops: Fp32Ops | None = None) -> dict:
    """Convert one traced function (with its states, if any) into a single-function package.

    `fp32_ops`: the selectors of a whole multifunction package (`convert_functions`), which checks
    them once all its functions are converted: a selector need only match ops of one function.

    `convert_export` is this for a package of one function; the functions of a package of several
    (`prefill`, `decode`) are converted one by one and merged with `anetts.compile.bundle.bundle_packages`,
    which keeps their shared states and weights.  The report's `bucket` is `bucket`, else the
    function's name; its `functions` is the one function typed (`FunctionSpec.to_json`).
    """
    outs = (out_package, out_report) + ((out_inspect,) if out_inspect is not None else ())
    clear_outputs(*outs)
    ct = _ct()
    import torch

    bucket, geometry = bucket or function.name, dict(geometry or {})
    where = f"{stage}/{bucket}"
    states = state_types(function.states, options.deployment_target, where)
    if options.precision not in PRECISIONS:
        raise ConversionError(f"unknown precision {options.precision!r}; choose one of {PRECISIONS}")
    try:
        target = getattr(ct.target, options.deployment_target)
    except AttributeError:
        raise ConversionError(f"unknown deployment target {options.deployment_target!r}") from None

    t0 = time.perf_counter()
    traced = torch.jit.load(str(torchscript)).eval()
    inputs = [ct.TensorType(name=t.name, shape=t.shape, dtype=DTYPES[t.dtype]) for t in function.inputs]
    outputs = [ct.TensorType(name=t.name, dtype=DTYPES[t.dtype]) for t in function.outputs]
    own_selectors = fp32_ops is None
    fp32_ops = Fp32Ops(options.fp32_ops, options.precision, where) if own_selectors else fp32_ops
    precision = fp32_ops.compute_precision(ct, options.precision)
    rewrite = LinearRewrite(options.linear_rewrite, where=where)
    try:
        with warnings.catch_warnings(), validated_once() as validate_noted, program_text_skipped():
            warnings.simplefilter("ignore")
            mlmodel = ct.convert(traced, inputs=inputs, outputs=outputs, convert_to="mlprogram",
                                 compute_precision=precision, minimum_deployment_target=target,
                                 pass_pipeline=rewrite.pass_pipeline(), **({"states": states} if states else {}))
            validate_noted()
    except Exception as e:
        raise ConversionError(f"coremltools failed on {where}: {type(e).__name__}: {e}") from e
    rewrite.check(mlmodel)  # a rewrite that matched nothing, or left a linear behind, is an error
    if own_selectors:
        fp32_ops.check()  # so is an fp32_ops selector that matched nothing
    t1 = time.perf_counter()

    stamp = package_stamp(model_meta, stage, bucket, geometry, options.precision,
                          compute_units=options.compute_units, linear_rewrite=options.linear_rewrite,
                          **({"fp32_ops": json.dumps(list(options.fp32_ops))} if options.fp32_ops else {}))
    mlmodel.short_description = stamp.description
    mlmodel.author = stamp.author
    mlmodel.license = stamp.licence
    mlmodel.version = stamp.version
    for t in function.inputs:
        mlmodel.input_description[t.name] = t.description
    for t in function.outputs:
        mlmodel.output_description[t.name] = t.description
    meta = stamp.metadata
    mlmodel.user_defined_metadata.update(meta)

    with atomic_outputs(*outs) as tmps:
        tmp_pkg, tmp_report = tmps[:2]
        mlmodel.save(str(tmp_pkg))
        drop_temp_package(mlmodel)
        stabilize_package(tmp_pkg)  # the same inputs give the same bytes (sha256)
        io = package_io(tmp_pkg)
        _check_io(function, io, tmp_pkg)
        _check_states(function, io, tmp_pkg)
        info = inspect_package(tmp_pkg)
        lint = info["lint"]
        apply_lint_policy(lint, options.fatal_lint)
        check_size(tmp_pkg, options, where)
        report = {
            "stage": stage,
            "bucket": bucket,
            "geometry": geometry,
            "package": Path(out_package).name,
            "sha256": tree_sha256(tmp_pkg),
            "bytes": tree_bytes(tmp_pkg),
            "deployment_target": options.deployment_target,
            "precision": options.precision,
            "compute_units": options.compute_units,
            **io,
            # the package's one function typed (the package names it as Core ML does, `main`)
            "default_function": function.name,
            "functions": [function.to_json()],
            "ops": {name: fn["ops"] for name, fn in info["functions"].items()},
            # multiply-accumulates of one call per function (the manifest's ANE-eligible share)
            "macs": {name: fn["macs"] for name, fn in info["functions"].items()},
            "linear_rewrite": rewrite.report(),
            # per selector: the op types it kept fp32 (counted at the fp16 pass)
            "fp32_ops": fp32_ops.report(),
            "lint": lint,
            "seconds": {"convert": round(t1 - t0, 3), "total": round(time.perf_counter() - t0, 3)},
            "metadata": meta,
            "provenance": provenance(),
        }
        write_json(tmp_report, report)
        if out_inspect is not None:
            write_json(tmps[2], {**info, "package": str(out_package)})
    log.info("converted %s in %.1fs", where, report["seconds"]["total"])
    return report


def drop_temp_package(mlmodel) -> None:
    """Delete the package coremltools converted into, once it is saved: coremltools deletes it only at
    interpreter exit (an atexit hook), so each conversion kept a copy of its weights on disk to the
    job's end (a multifunction chunk of Fish S2 Pro: one per function). `mlmodel` is unusable after."""
    if getattr(mlmodel, "is_temp_package", False) and mlmodel.package_path and Path(mlmodel.package_path).is_dir():
        shutil.rmtree(mlmodel.package_path)


def check_size(package: Path, options: ConvertOptions, where: str) -> int:
    """The per-file size lint: Core ML loads a package's weights as one file, and above ~2 GB
    (macOS) or ~1 GB (iOS) it fails or pages; a bigger package needs more chunks."""
    n = tree_bytes(package)
    if n > options.max_package_mb * 1e6:
        raise ConversionError(f"{where}: package is {n / 1e6:.1f} MB, above max_package_mb = {options.max_package_mb} "
                              f"(split the stage into more chunks, or raise the limit for a platform that allows it)")
    return n


def convert_functions(torchscripts: dict[str, Path], functions: list[FunctionSpec], out_package: Path, work_dir: Path,
                      options: ConvertOptions, model_meta: dict, stage: str, geometry: dict | None = None,
                      bucket: str | None = None) -> tuple[dict, dict]:
    """Each function's TorchScript converted with its states (`convert_function`, into `work_dir`)
    and merged into one multifunction package at `out_package` sharing weights and states, the
    first function its default. Returns (bundle report with its `seconds`, {function: convert
    report}). The one
    convert-and-bundle path: rule `convert` of a package of several functions, and `compile_module`."""
    from anetts.compile.bundle import bundle_packages

    where = f"{stage}/{bucket}" if bucket else stage
    parts, reports = {}, {}
    fp32_ops = Fp32Ops(options.fp32_ops, options.precision, where)
    for fn in functions:
        ts = Path(torchscripts[fn.name]) if fn.name in torchscripts else None
        if ts is None or not ts.is_file():
            raise ConversionError(f"{where}: function {fn.name} has no TorchScript {ts}")
        parts[fn.name] = Path(work_dir) / f"{fn.name}.mlpackage"
        reports[fn.name] = convert_function(ts, fn, parts[fn.name], Path(work_dir) / f"{fn.name}.json", options,
                                            model_meta, stage=stage, geometry=geometry, fp32_ops=fp32_ops)
    fp32_ops.check()
    meta = {**reports[functions[0].name]["metadata"], **({"anetts.bucket": bucket} if bucket else {})}
    t0 = time.perf_counter()
    bundle = bundle_packages(parts, out_package, default_function=functions[0].name, metadata=meta)
    bundle["seconds"] = round(time.perf_counter() - t0, 3)
    return bundle, reports


def _convert_multifunction(functions_dir: Path, functions: list[FunctionSpec], stage: str, bucket: str,
                           geometry: dict, out_package: Path, out_report: Path, options: ConvertOptions,
                           model_meta: dict, out_inspect: Path | None) -> dict:
    """Functions (one TorchScript each, with their states) converted one by one and merged into one
    multifunction package sharing weights and states; size-linted as a whole."""
    import tempfile

    outs = (out_package, out_report) + ((out_inspect,) if out_inspect is not None else ())
    clear_outputs(*outs)
    where = f"{stage}/{bucket}"
    torchscripts = {fn.name: Path(functions_dir) / f"{fn.name}.pt" for fn in functions}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f".{Path(out_package).name}.", dir=Path(out_package).parent) as tmp_dir:
        with atomic_outputs(*outs) as tmps:
            tmp_pkg, tmp_report = tmps[:2]
            bundle, reports = convert_functions(torchscripts, functions, tmp_pkg, Path(tmp_dir), options, model_meta,
                                                stage, geometry, bucket=bucket)
            meta = {**reports[functions[0].name]["metadata"], "anetts.bucket": bucket}
            size = check_size(tmp_pkg, options, where)
            info = inspect_package(tmp_pkg)
            default = reports[functions[0].name]
            report = {
                "stage": stage,
                "bucket": bucket,
                "geometry": geometry,
                "package": Path(out_package).name,
                "sha256": tree_sha256(tmp_pkg),
                "bytes": size,
                "deployment_target": options.deployment_target,
                "precision": options.precision,
                "compute_units": options.compute_units,
                # the default function's I/O (what a single-function reader sees), then every function's
                "inputs": default["inputs"],
                "outputs": default["outputs"],
                "default_function": functions[0].name,
                "functions": [f.to_json() for f in functions],
                "ops": {name: fn["ops"] for name, fn in info["functions"].items()},
                "macs": {name: fn["macs"] for name, fn in info["functions"].items()},
                "linear_rewrite": {name: r["linear_rewrite"] for name, r in reports.items()},
                "lint": info["lint"],
                "weight_bytes_fp16": bundle["weight_bytes_fp16"],
                "ratio_to_fp16_weights": bundle.get("ratio"),
                "seconds": {"convert": {name: r["seconds"]["convert"] for name, r in reports.items()},
                            "total": round(time.perf_counter() - t0, 3)},
                "metadata": meta,
                "provenance": provenance(),
            }
            write_json(tmp_report, report)
            if out_inspect is not None:
                write_json(tmps[2], {**info, "package": str(out_package)})
    log.info("converted %s: %d functions, %.1f MB in %.1fs", where, len(functions), size / 1e6, report["seconds"]["total"])
    return report


def _check_io(function: FunctionSpec, io: dict, package: Path) -> None:
    want_in = {t.name: (list(t.shape), t.dtype) for t in function.inputs}
    want_out = {t.name: t.dtype for t in function.outputs}
    got_in = {t["name"]: (t["shape"], t["dtype"]) for t in io["inputs"]}
    got_out = {t["name"]: t["dtype"] for t in io["outputs"]}
    if got_in != want_in:
        raise ConversionError(f"{package}: inputs {got_in} do not match the export spec {want_in}")
    if got_out != want_out:
        raise ConversionError(f"{package}: outputs {got_out} do not match the export spec {want_out}")


def _check_states(function: FunctionSpec, io: dict, package: Path) -> None:
    want = {t.name: (list(t.shape), t.dtype) for t in function.states}
    got = {t["name"]: (t["shape"], t["dtype"]) for t in io.get("states", [])}
    if got != want:
        raise ConversionError(f"{package}: states {got} do not match the function's {want}")


def op_histogram(package: Path) -> dict[str, dict[str, int]]:
    """Op type counts per function of a saved ML Program (the inspect walker, nested blocks included)."""
    return {name: fn["ops"] for name, fn in inspect_package(package)["functions"].items()}
