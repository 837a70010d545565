"""Merge per-bucket .mlpackages of a stage into one multifunction .mlpackage.

``ct.utils.save_multifunction`` loads every source program into pymil, appends each as a
named function, marks byte-identical consts across functions with a shared ``weight_id``
(``const_deduplication._deduplicate_const_across_functions``) so they are written once to the
weight file, and re-serialises.  Notes from coremltools 9.0's source, checked here:

* the bundle's specification version is ``max(sources, iOS18)``: macOS13 (spec 7) buckets
  come out as spec 9 (iOS18/macOS15), because multifunction models need it.  The report
  records ``specification_version_sources`` and ``spec_upgraded``.  Loading the bundle
  therefore needs macOS15/iOS18, while the single-bucket packages keep macOS13;
* the new model description only carries the functions, so ``user_defined`` metadata,
  author/license/version and descriptions would be lost; :func:`bundle_packages` writes them
  back (values common to all sources, plus ``anetts.functions`` / ``anetts.default_function``);
* dedup needs byte-identical consts.  Buckets converted from the same weights give identical
  fp16 weights; compressed (palettized) buckets usually do not (docs/ane-notes.md §7), which
  shows up as ``weight_bytes_fp16`` (content-unique over all sources) >
  ``largest_function_weight_bytes_fp16`` and ``weights_shared: false``.  Bucket-shaped folded
  consts (e.g. ALBERT's position/token-type embedding slices [1, T, 128]) are legitimately
  per function: ``function_specific_weight_bytes``;
* ``ratio`` compares stored bytes with the *fp16* bytes of the weights.  At macOS13 (iOS16
  opset) MIL ``lstm`` is fp32-only, so LSTM weights are stored fp32 and stages with LSTMs
  (duration, f0ntrain) cannot reach 1.15 unless converted for macOS14+ (iOS17 ``lstm``
  accepts fp16).  ``bundle_weight_bytes_by_dtype`` shows it.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from collections import Counter
from pathlib import Path

from anetts.artifacts import atomic_outputs, tree_bytes, tree_sha256
from anetts.compile.inspect import (BlobFile, _resolve_blob_path, fp16_bytes, function_io, function_weights,
                                  load_spec, op_counts, package_files)
from anetts.compile.pipeline_trims import program_text_skipped, validated_once
from anetts.compile.reproducible import stabilize_package
# a bucket's function name: also what parity and the runtime call a bundle's functions by
from anetts.tensors import IDENTIFIER, function_name

GOAL_RATIO = 1.15  # all buckets of a stage <= 1.15 x the fp16 bytes of the weights they use


class BundleError(RuntimeError):
    pass


def _ct():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import coremltools as ct
    return ct


def _io_key(fio: dict) -> dict:
    return {k: [(t["name"], t.get("shape"), t.get("dtype")) for t in fio.get(k, [])] for k in ("inputs", "outputs")}


def weight_content(packages: dict[str, Path]) -> dict:
    """fp16 bytes of the weights the sources use, deduplicated by content across sources.

    Returns {"per_function": {name: fp16 bytes}, "unique": fp16 bytes of distinct blobs,
    "largest_function": max per function}.  Blobs are identified by (dtype, sha256 of data).
    """
    per_fn, unique = {}, {}
    for name, path in packages.items():
        _, spec_file, _ = package_files(path)
        spec = load_spec(path)
        src_fn = spec.description.defaultFunctionName or "main"
        weights = function_weights(spec, spec_file.parent)
        info = weights.get(src_fn) or next(iter(weights.values()))
        readers: dict[str, BlobFile] = {}
        total = 0
        try:
            for (fname, offset), (dtype, nbytes) in info["blobs"].items():
                if fname not in readers:
                    readers[fname] = BlobFile(_resolve_blob_path(fname, spec_file.parent))
                digest = hashlib.sha256(readers[fname].data(offset)).hexdigest()
                n16 = fp16_bytes(dtype, nbytes)
                unique[(dtype, digest)] = n16
                total += n16
        finally:
            for r in readers.values():
                r.close()
        per_fn[name] = total
    return {"per_function": per_fn, "unique": sum(unique.values()),
            "largest_function": max(per_fn.values()) if per_fn else 0}


def bundle_packages(packages: dict[str, Path], out: Path, default_function: str,
                    metadata: dict[str, str] | None = None) -> dict:
    """Merge ``{function name: single-bucket .mlpackage}`` into one multifunction package at
    ``out`` (atomic: a temp path beside ``out`` renamed into place; nothing left on failure).

    Returns a JSON-able report: per-function I/O, bytes (bundle, sum of inputs), the fp16
    bytes of the unique weights (``weight_bytes_fp16``) and ``ratio = bundle_bytes /
    weight_bytes_fp16`` with the project goal ``ratio <= 1.15``.
    """
    ct = _ct()
    out = Path(out)
    packages = {str(k): Path(v) for k, v in packages.items()}
    if not packages:
        raise BundleError("no packages to bundle")
    if default_function not in packages:
        raise BundleError(f"default function {default_function!r} is not one of {sorted(packages)}")
    for name, path in packages.items():
        if not (path / "Manifest.json").is_file():
            raise BundleError(f"function {name!r}: {path} is not an .mlpackage")
        if not IDENTIFIER.match(name):
            raise BundleError(f"function name {name!r} is not an identifier; use function_name({name!r}) "
                              f"= {function_name(name)!r}")

    src_specs = {name: load_spec(path) for name, path in packages.items()}
    src_io, src_fn, src_ops = {}, {}, {}
    for name, spec in src_specs.items():
        if spec.WhichOneof("Type") != "mlProgram":
            raise BundleError(f"function {name!r}: {packages[name]} is not an ML Program")
        fn = spec.description.defaultFunctionName or "main"
        ios = function_io(spec)
        if len(ios) != 1:
            raise BundleError(f"function {name!r}: {packages[name]} already has {len(ios)} functions; "
                              "bundle single-function packages")
        src_fn[name] = fn
        src_io[name] = ios[fn]
        src_ops[name] = op_counts(spec)[fn]

    desc = ct.utils.MultiFunctionDescriptor()
    for name, path in packages.items():
        desc.add_function(str(path), src_fn[name], name)
    desc.default_function_name = default_function

    meta = _common_metadata(src_specs)
    meta.update({"anetts.functions": json.dumps(list(packages)), "anetts.default_function": default_function})
    meta.update({k: str(v) for k, v in (metadata or {}).items()})
    first = src_specs[default_function].description.metadata

    with atomic_outputs(out) as (tmp,):
        try:
            with warnings.catch_warnings(), validated_once() as validate_noted, program_text_skipped():
                warnings.simplefilter("ignore")
                ct.utils.save_multifunction(desc, str(tmp))
                validate_noted()  # the merged program, once (it runs no passes, and was validated 108 times)
        except Exception as e:
            raise BundleError(f"coremltools failed to bundle {sorted(packages)} into {Path(out).name}: "
                              f"{type(e).__name__}: {e}") from e
        _, spec_file, _ = package_files(tmp)
        spec = load_spec(tmp)
        md = spec.description.metadata
        md.shortDescription = first.shortDescription
        md.author, md.license, md.versionString = first.author, first.license, first.versionString
        for k, v in meta.items():
            md.userDefined[k] = v
        for fd in spec.description.functions:  # feature descriptions per function
            src = src_specs[fd.name].description
            for kind in ("input", "output"):
                texts = {f.name: f.shortDescription for f in getattr(src, kind)}
                for f in getattr(fd, kind):
                    if texts.get(f.name):
                        f.shortDescription = texts[f.name]
        spec_file.write_bytes(spec.SerializeToString())
        stabilize_package(tmp)  # the same inputs give the same bytes (sha256)
        _verify(tmp, packages, src_io, src_ops, default_function)
        bundle_bytes = tree_bytes(tmp)
        sha = tree_sha256(tmp)
        spec = load_spec(tmp)

    weights = weight_content(packages)
    _, out_spec_file, _ = package_files(out)
    bw = function_weights(spec, out_spec_file.parent)
    bundle_unique, users = {}, Counter()
    for info in bw.values():
        bundle_unique.update(info["blobs"])
        users.update(info["blobs"].keys())
    by_dtype = Counter()
    for dtype, n in bundle_unique.values():
        by_dtype[dtype] += n
    specific = sum(n for key, (_, n) in bundle_unique.items() if users[key] < len(bw))
    unique = weights["unique"]
    versions = sorted({int(s.specificationVersion) for s in src_specs.values()})
    report = {
        "package": str(out),
        "sha256": sha,
        "default_function": default_function,
        "functions": {name: {"source": str(packages[name]), **src_io[name],
                             "op_count": sum(src_ops[name].values())} for name in packages},
        "specification_version": int(spec.specificationVersion),
        "specification_version_sources": versions,
        "spec_upgraded": int(spec.specificationVersion) > max(versions),
        "bundle_bytes": bundle_bytes,
        "input_bytes_sum": sum(tree_bytes(p) for p in packages.values()),
        "weight_bytes_fp16": unique,
        "largest_function_weight_bytes_fp16": weights["largest_function"],
        "per_function_weight_bytes_fp16": weights["per_function"],
        "bundle_weight_blobs": len(bundle_unique),
        "bundle_weight_bytes": sum(n for _, n in bundle_unique.values()),
        "bundle_weight_bytes_by_dtype": dict(sorted(by_dtype.items())),
        # blobs not shared by every function: bucket-shaped folded consts, or weights that
        # differ per bucket (then dedup cannot help)
        "function_specific_weight_bytes": specific,
        "ratio": round(bundle_bytes / unique, 4) if unique else None,
        "ratio_vs_largest_function": (round(bundle_bytes / weights["largest_function"], 4)
                                      if weights["largest_function"] else None),
        "goal_ratio": GOAL_RATIO,
    }
    report["goal_met"] = report["ratio"] is not None and report["ratio"] <= GOAL_RATIO
    # buckets whose weights are not byte-identical cannot share them (e.g. per-bucket palettization)
    report["weights_shared"] = unique <= 1.01 * weights["largest_function"]
    return report


def _common_metadata(specs) -> dict[str, str]:
    """user_defined entries whose value is the same in every source (bucket keys drop out)."""
    metas = [dict(s.description.metadata.userDefined) for s in specs.values()]
    common = dict(metas[0])
    for m in metas[1:]:
        common = {k: v for k, v in common.items() if m.get(k) == v}
    buckets = [m.get("anetts.bucket") for m in metas]
    if all(buckets):
        common["anetts.buckets"] = json.dumps(buckets)
    return common


def _verify(pkg: Path, packages, src_io, src_ops, default_function) -> None:
    spec = load_spec(pkg)
    ios = function_io(spec)
    if set(ios) != set(packages):
        raise BundleError(f"bundle has functions {sorted(ios)}, expected {sorted(packages)}")
    if (spec.description.defaultFunctionName or "") != default_function:
        raise BundleError(f"bundle default function is {spec.description.defaultFunctionName!r}")
    hist = op_counts(spec)
    for name in packages:
        if _io_key(ios[name]) != _io_key(src_io[name]):
            raise BundleError(f"function {name!r}: I/O {_io_key(ios[name])} != source {_io_key(src_io[name])}")
        a = {k: v for k, v in hist[name].items() if k != "const"}
        b = {k: v for k, v in src_ops[name].items() if k != "const"}
        if a != b:
            raise BundleError(f"function {name!r}: ops changed in the bundle: {a} != {b}")
