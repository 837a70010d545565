"""Compressed variants of converted packages: weight-only int8 / palettization, gated by parity.

A variant is a named set of compression settings applied to some stages of a model (config
`variants.<name>`). Each of its packages is made from the stage's verified fp16/fp32 package with
`coremltools.optimize.coreml` (no re-export, no re-conversion) and scored against the same eager
fp32 reference as the base package (`anetts.verify.parity.run_parity`). A package below its gate
is deleted before it is ever moved into place: the rule fails with the measured dB and only a
`.failed.json` report is left.

Every default lives in `DEFAULTS`; the schema only restricts the values.
"""
from __future__ import annotations

import json
import logging
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

from anetts.artifacts import (atomic_outputs, clear_outputs, failed_report_path, tree_bytes, tree_sha256,
                              weight_file_bytes, write_json)
from anetts.compile.spec_walk import program_ops
from anetts.compile.reproducible import stabilize_package
from anetts.provenance import provenance

log = logging.getLogger(__name__)

MODES = ("linear", "palettize")
# Defaults of every compression key, per mode. `weight_threshold` is coremltools' own default
# (tensors with fewer elements stay uncompressed: their bytes do not matter and small tensors
# such as biases and norms are the sensitive ones). `exclude_op_names`: weights (const names, or
# the names of the ops that consume them) that stay uncompressed, for the few tensors that cost a
# stage its gate (benchmarks/variants_search.py measures which).
DEFAULTS = {
    "linear": {"dtype": "int8", "granularity": "per_channel", "block_size": 32, "symmetric": True,
               "weight_threshold": 2048, "exclude_op_types": [], "exclude_op_names": []},
    "palettize": {"nbits": 8, "algorithm": "kmeans", "granularity": "per_tensor", "group_size": 16,
                  "weight_threshold": 2048, "exclude_op_types": [], "exclude_op_names": []},
}
# (setting → first deployment target whose opset has the constexpr op coremltools emits for it)
_IOS18_ONLY = {
    ("linear", "granularity", "per_block"): "constexpr_blockwise_shift_scale",
    ("linear", "dtype", "int4"): "constexpr_blockwise_shift_scale",
    ("linear", "dtype", "uint4"): "constexpr_blockwise_shift_scale",
    ("palettize", "granularity", "per_grouped_channel"): "constexpr_lut_to_dense (iOS18)",
    ("palettize", "nbits", 3): "constexpr_lut_to_dense (iOS18)",
}
IOS18_TARGETS = ("macOS15", "macOS26", "iOS18", "iOS26")
VALID = {
    "linear": {"dtype": ("int8", "uint8", "int4", "uint4"),
               "granularity": ("per_tensor", "per_channel", "per_block")},
    "palettize": {"nbits": (1, 2, 3, 4, 6, 8), "algorithm": ("kmeans", "uniform"),
                  "granularity": ("per_tensor", "per_grouped_channel")},
}
CONSTEXPR_PREFIX = "constexpr_"


class CompressionError(ValueError):
    pass


def resolve_settings(settings: dict, where: str) -> dict:
    """The full settings of one stage of a variant (defaults filled in), or an error naming the key."""
    mode = settings.get("mode")
    if mode not in MODES:
        raise CompressionError(f"{where}.mode: {mode!r} is not one of {list(MODES)}")
    defaults = DEFAULTS[mode]
    unknown = sorted(set(settings) - set(defaults) - {"mode"})
    if unknown:
        raise CompressionError(f"{where}.{unknown[0]}: not a {mode} setting; known: {sorted(defaults)}")
    out = {"mode": mode, **defaults, **settings}
    for key, allowed in VALID[mode].items():
        if out[key] not in allowed:
            raise CompressionError(f"{where}.{key}: {out[key]!r} is not one of {list(allowed)}")
    for key, least in (("block_size", 1), ("group_size", 1), ("weight_threshold", 0)):
        if key in out and (not isinstance(out[key], int) or isinstance(out[key], bool) or out[key] < least):
            raise CompressionError(f"{where}.{key}: {out[key]!r} must be an integer >= {least}")
    for key in ("exclude_op_types", "exclude_op_names"):
        if not isinstance(out[key], list) or not all(isinstance(n, str) and n for n in out[key]):
            raise CompressionError(f"{where}.{key}: {out[key]!r} must be a list of names")
        out[key] = sorted(set(out[key]))
    return out


def required_ops(settings: dict) -> list[tuple[str, str]]:
    """(key, constexpr op) of every setting that needs the iOS18 opset."""
    return [(k, op) for (m, k, v), op in _IOS18_ONLY.items() if m == settings["mode"] and settings.get(k) == v]


def check_target(settings: dict, deployment_target: str, where: str, stage: str) -> None:
    """Per-block int8/int4 and grouped-channel or 3-bit LUTs exist only from the iOS18 opset on."""
    if deployment_target in IOS18_TARGETS:
        return
    for key, op in required_ops(settings):
        raise CompressionError(
            f"{where}.{key}: {settings[key]!r} needs {op}, first in the iOS18/macOS15 opset, but stage {stage}'s "
            f"deployment_target is {deployment_target}; raise the stage's deployment_target or pick another {key}")


def _ct():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import coremltools as ct
    return ct


def op_config(settings: dict):
    """The coremltools OpCompressorConfig for these settings."""
    from coremltools.optimize import coreml as cto

    if settings["mode"] == "linear":
        kw = {"mode": "linear_symmetric" if settings["symmetric"] else "linear", "dtype": settings["dtype"],
              "granularity": settings["granularity"], "weight_threshold": settings["weight_threshold"]}
        if settings["granularity"] == "per_block":
            kw["block_size"] = settings["block_size"]
        return cto.OpLinearQuantizerConfig(**kw)
    kw = {"mode": settings["algorithm"], "nbits": settings["nbits"], "granularity": settings["granularity"],
          "weight_threshold": settings["weight_threshold"]}
    if settings["granularity"] == "per_grouped_channel":
        kw["group_size"] = settings["group_size"]
    return cto.OpPalettizerConfig(**kw)


def _ops(spec) -> list[str]:
    return [op.type for _, op in program_ops(spec)]


def _op_names(spec) -> set[str]:
    """Every op's name and output names (what coremltools' op_name_configs may key on)."""
    names = set()
    for _, op in program_ops(spec):
        a = op.attributes.get("name")
        if a is not None:
            names.update(a.immediateValue.tensor.strings.values)
        names.update(o.name for o in op.outputs)
    return names


def _kept_consts(spec, uncompressed, where: str, package: Path) -> dict[str, list[str]]:
    """The consts of each weight a stage keeps uncompressed (`Stage.uncompressed_weights`): named
    after its parameter (conversion appends `_to_fp16`, the linear rewrite `_conv_<op>`)."""
    consts = {o.name for _, op in program_ops(spec) if op.type == "const" for o in op.outputs}
    kept = {w: sorted(n for n in consts if n == w or n.startswith(f"{w}_")) for w in uncompressed}
    missing = [w for w, names in kept.items() if not names]
    if missing:
        raise CompressionError(f"{where}: the stage keeps weights {missing} uncompressed (its export report's "
                               f"uncompressed_weights), but no const of {package} is named after them")
    return kept




def _pass(settings: dict, config):
    """coremltools' compression graph pass for these settings, configured (what
    `linear_quantize_weights` / `palettize_weights` apply to a single-function model)."""
    from coremltools.converters.mil.mil.passes.graph_pass import PassOption
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY

    name = "compression::linear_quantize_weights" if settings["mode"] == "linear" else "compression::palettize_weights"
    graph_pass = PASS_REGISTRY[name]
    graph_pass.set_options([PassOption("config", config), PassOption("joint_compression", False)])
    return graph_pass


def _compress_multifunction(mlmodel, package: Path, settings: dict, config):
    """A multifunction package (Fish's AR stages: functions sharing weights, with states) compressed.

    coremltools' PTQ functions refuse multifunction models; their graph pass runs on every function
    of the program, then consts equal across functions get one weight id again — the step
    `coremltools.utils.save_multifunction` takes — so the functions still share one compressed copy."""
    from coremltools.converters.mil.converter import mil_convert
    from coremltools.converters.mil.frontend.milproto import load as milproto
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY
    from coremltools.models.utils import _try_get_weights_dir_path

    spec = mlmodel.get_spec()
    prog = milproto.load(spec, spec.specificationVersion, _try_get_weights_dir_path(str(package)))
    prog.default_function_name = spec.description.defaultFunctionName
    _pass(settings, config).apply(prog)
    PASS_REGISTRY["common::const_deduplication"]._deduplicate_const_across_functions(prog)
    prog.skip_all_passes = True
    prog.export_as_multifunction = True
    return mil_convert(prog, convert_to="mlprogram", convert_from="milinternal",
                       specification_version=spec.specificationVersion, compute_units=mlmodel.compute_unit,
                       model_description=spec.description, skip_model_load=True)


class _SkippedWeights(logging.Handler):
    """Collects coremltools' warnings for weights it leaves uncompressed because a group or block
    size does not divide their shape (it skips them silently otherwise)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if "not divisible by" in msg:
            self.messages.append(msg)


def _check_skipped(messages: list[str], settings: dict, where: str, package: Path) -> None:
    if not messages:
        return
    key = "group_size" if any("channel_group_size" in m for m in messages) else "block_size"
    raise CompressionError(f"{where}.{key}: {settings[key]} does not divide the shape of {len(messages)} weight(s) of "
                           f"{package}, which would stay uncompressed; coremltools: {messages[0]}")


def compress_model(base_package: Path, settings: dict, where: str, uncompressed: Sequence[str] = ()):
    """The compressed MLModel (not saved), the constexpr op counts it gained, and the consts left
    uncompressed because the stage keeps those weights (`uncompressed`: parameter names)."""
    ct = _ct()
    from coremltools.optimize import coreml as cto

    mlmodel = ct.models.MLModel(str(base_package), skip_model_load=True)
    spec = mlmodel.get_spec()
    present = set(_ops(spec))
    missing = [t for t in settings["exclude_op_types"] if t not in present]
    if missing:
        raise CompressionError(f"{where}.exclude_op_types: {missing} match no op of {base_package} "
                               f"(its ops: {sorted(t for t in present if t != 'const')})")
    names = settings.get("exclude_op_names", [])
    unknown = sorted(set(names) - _op_names(spec)) if names else []
    if unknown:
        raise CompressionError(f"{where}.exclude_op_names: {unknown} name no op or weight of {base_package}")
    kept = _kept_consts(spec, uncompressed, where, Path(base_package))
    config = cto.OptimizationConfig(global_config=op_config(settings),
                                    op_type_configs={t: None for t in settings["exclude_op_types"]} or None,
                                    op_name_configs={n: None for n in [*names, *sum(kept.values(), [])]} or None)
    fn = cto.linear_quantize_weights if settings["mode"] == "linear" else cto.palettize_weights
    skipped = _SkippedWeights()
    ct_log = logging.getLogger("coremltools")
    ct_log.addHandler(skipped)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if mlmodel._is_multifunction():
                out = _compress_multifunction(mlmodel, Path(base_package), settings, config)
            else:
                out = fn(mlmodel, config)
    except Exception as e:
        raise CompressionError(f"{where}: coremltools could not compress {base_package}: {type(e).__name__}: {e}") from e
    finally:
        ct_log.removeHandler(skipped)
    _check_skipped(skipped.messages, settings, where, Path(base_package))
    before = {t for t in present if t.startswith(CONSTEXPR_PREFIX)}
    gained = {}
    for t in _ops(out.get_spec()):
        if t.startswith(CONSTEXPR_PREFIX) and t not in before:
            gained[t] = gained.get(t, 0) + 1
    if not gained:
        raise CompressionError(f"{where}: no weight of {base_package} was compressed (every tensor is below "
                               f"weight_threshold={settings['weight_threshold']} elements or excluded)")
    # the package keeps the base's descriptions and metadata; the variant is recorded beside them
    out.user_defined_metadata.update({"anetts.variant": settings.get("variant", ""),
                                      "anetts.compression": json.dumps({k: v for k, v in settings.items() if k != "variant"},
                                                                       sort_keys=True)})
    return out, gained, kept


def compress_and_gate(stage: str, base_package: Path, base_report: Path, settings: dict, gate,
                      score: Callable[[Path], dict], out_package: Path, out_report: Path, out_parity: Path,
                      variant: str, default_gate=None, uncompressed: Sequence[str] = ()) -> dict:
    """Compress one package, score it with `score` (`anetts.verify.parity.run_parity` against the
    package's export), and keep it only if it passes `gate`. `uncompressed`: weights the stage keeps at its precision.

    Writes `out_package`, `out_report` (the base convert report's keys, so the manifest writer
    reads it unchanged, plus a `compression` block) and `out_parity`. On a failed gate nothing of
    these exists afterwards; `<out_parity stem>.failed.json` holds the measured report.
    """
    # imported here, not at the top: the Snakefile imports this module (anetts.variants) and its
    # parse must not pay for numpy
    from anetts.gate import describe_gate, raise_failed

    where = f"variants.{variant}"
    outs = (Path(out_package), Path(out_report), Path(out_parity))
    clear_outputs(*outs, failed_report_path(out_parity))
    base = json.loads(Path(base_report).read_text(encoding="utf-8"))
    check_target(settings, base["deployment_target"], where, stage)
    t0 = time.perf_counter()
    mlmodel, gained, kept = compress_model(base_package, {**settings, "variant": variant}, where, uncompressed)
    t1 = time.perf_counter()
    with atomic_outputs(*outs) as (tmp_pkg, tmp_report, tmp_parity):
        mlmodel.save(str(tmp_pkg))
        stabilize_package(tmp_pkg)  # the same inputs give the same bytes (sha256)
        report = score(tmp_pkg)
        report.pop("_arrays", None)  # the base parity job keeps the plot arrays; a variant needs its numbers
        nbytes, wbytes = tree_bytes(tmp_pkg), weight_file_bytes(tmp_pkg)
        base_w = weight_file_bytes(base_package)
        sizes = {"bytes": nbytes, "weight_bytes": wbytes, "base_bytes": base["bytes"], "base_weight_bytes": base_w,
                 "size_ratio": round(nbytes / base["bytes"], 4), "weight_ratio": round(wbytes / base_w, 4) if base_w else None}
        report.update({"variant": variant, "default_gate": asdict(default_gate) if default_gate else None,
                       "settings": settings, "sizes": sizes})
        if not report["passed"]:
            raise_failed(report, out_parity, f"variant {variant} {stage}/{report['bucket']} failed its gate "
                         f"({describe_gate(report)}): measured {_measured(report)}; nothing was kept")
        compressed = {
            **{k: base[k] for k in ("stage", "bucket", "geometry", "deployment_target", "precision", "compute_units",
                                    "inputs", "outputs")},
            # the package's functions (sharing the compressed weights) and states
            **{k: base[k] for k in ("functions", "default_function") if k in base},
            "package": Path(out_package).name,
            "sha256": tree_sha256(tmp_pkg),
            "bytes": nbytes,
            "weight_bytes": wbytes,
            "compression": {
                "variant": variant, "settings": settings, "constexpr_ops": gained, "uncompressed_weights": kept,
                "base_package": str(base_package), **{k: sizes[k] for k in ("base_bytes", "base_weight_bytes",
                                                                            "size_ratio", "weight_ratio")},
            },
            "seconds": {"compress": round(t1 - t0, 3), "total": round(time.perf_counter() - t0, 3)},
            "provenance": provenance(),
        }
        write_json(tmp_report, compressed)
        write_json(tmp_parity, report)
    log.info("variant %s %s/%s: %.3f x bytes, %s", variant, stage, report["bucket"],
             compressed["compression"]["size_ratio"], _measured(report))
    return compressed


def _measured(report: dict) -> str:
    """Worst SNR and integer-output exact fractions per gated backend, e.g. `mil 31.2 dB`."""
    parts = []
    for name, b in report["backends"].items():
        if "passed" not in b:
            continue
        snr = b.get("min_snr_db")
        parts.append(f"{name} {snr:.1f} dB" if snr is not None else f"{name} - dB")
        parts += [f"{name} {o}: {m['exact_fraction']:.3f} exact" for o, m in b["outputs"].items() if "exact_fraction" in m]
        parts += [f"{name} {o}: top-1 {t['agreement']:.3f}" for o, t in b.get("top1", {}).items()]
    return ", ".join(parts)
