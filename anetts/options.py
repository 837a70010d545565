"""Conversion options and parity gates: their defaults and enums live in the config schema only.

Torch-free, so the workflow (at parse time) and the conversion/parity jobs build them the same way.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields
from pathlib import Path

SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "config.schema.yaml"


def load_schema(path: Path) -> dict:
    import yaml

    # libyaml's loader where PyYAML has it: the Snakefile reads this at every parse (no-op runs too)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(Path(path).read_text(encoding="utf-8"), Loader=loader)


@functools.lru_cache(maxsize=1)
def schema() -> dict:
    """The config schema (read once per process; callers must not modify it)."""
    return load_schema(SCHEMA)


def _defaults(properties: dict) -> dict:
    return {k: v["default"] for k, v in properties.items() if "default" in v}


def stage_schema_defaults() -> dict:
    """Defaults of every per-stage key (conversion options and the stage's build parameters)."""
    return _defaults(schema()["$defs"]["stage"]["properties"])


def stage_defaults() -> dict:
    """Per-stage conversion defaults (deployment target, precision, compute units, rewrite, lint, size)."""
    names = {f.name for f in fields(ConvertOptions)}
    return {k: v for k, v in stage_schema_defaults().items() if k in names}


def stage_build_keys() -> set[str]:
    """Per-stage keys that shape what is exported (buckets, chunks, prefill, lowering), not conversion."""
    names = {f.name for f in fields(ConvertOptions)}
    return set(schema()["$defs"]["stage"]["properties"]) - names


def gate_defaults() -> dict:
    return _defaults(schema()["$defs"]["gate"]["properties"])


def _default(name: str):
    return field(default_factory=lambda: stage_defaults()[name])


@dataclass(frozen=True)
class ConvertOptions:
    """ConvertOptions() is the schema's defaults; ConvertOptions.make(**stage_block) normalises a config block."""

    deployment_target: str = _default("deployment_target")  # a coremltools.target name
    precision: str = _default("precision")  # fp16 | fp32 compute
    compute_units: str = _default("compute_units")  # a hint recorded in metadata; CoreML picks units at load time
    linear_rewrite: str = _default("linear_rewrite")  # auto | none | conv1d | conv2d (anetts.compile.rewrite)
    fatal_lint: tuple[str, ...] = field(default_factory=lambda: tuple(stage_defaults()["fatal_lint"]))
    max_package_mb: float = _default("max_package_mb")  # size lint: a bigger package fails conversion
    # op selectors computed in fp32 inside an fp16 program (anetts.compile.convert.Fp32Ops)
    fp32_ops: tuple[str, ...] = field(default_factory=lambda: tuple(stage_defaults()["fp32_ops"]))

    @classmethod
    def make(cls, **overrides) -> "ConvertOptions":
        """The schema's defaults with `overrides` (a stage's config block)."""
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown conversion option(s) {sorted(unknown)}")
        values = {**stage_defaults(), **overrides}
        values["fatal_lint"] = tuple(sorted(values["fatal_lint"]))
        values["fp32_ops"] = tuple(sorted(values["fp32_ops"]))
        return cls(**values)


def _gate_default(name: str):
    return field(default_factory=lambda: gate_defaults()[name])


@dataclass(frozen=True)
class Gate:
    min_snr_db: float = _gate_default("min_snr_db")  # below: the package is rejected
    target_snr_db: float = _gate_default("target_snr_db")  # below: accepted with a warning
    # integer outputs (durations): fp16 may flip a rounding boundary
    min_exact_fraction: float = _gate_default("min_exact_fraction")
    # logits (a stage's declared logits outputs, the compiled chain): top-1 agreement with upstream
    min_top1: float = _gate_default("min_top1")

    @classmethod
    def make(cls, **overrides) -> "Gate":
        return cls(**{**gate_defaults(), **overrides})
