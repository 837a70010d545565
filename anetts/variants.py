"""Compressed variants as the Snakefile sees them: which stages each variant compresses, with what
settings and gate, and the file lists of its rules (rules/compress.smk).

config.yaml:

    variants:
      int8:
        mode: linear              # linear | palettize; the other keys and their defaults:
        dtype: int8               #   anetts.compile.compress.DEFAULTS
        stages: [generator]       # default: every stage of the model; a repeated stage's declared
                                  #   name (Fish `slow_chunk`) stands for all its instances
        overrides: {generator: {granularity: per_tensor}}   # per-stage settings; one that sets
                                  #   another mode starts from that mode's defaults
        gate: {min_snr_db: 30}    # default: the stage's parity gate
        in_all: false             # `snakemake all` builds it too (default: only `snakemake variants`)

Stages a variant does not compress keep the model's verified base package, so every variant
directory holds a complete manifest the runtime loads like a model directory. Every package is
gated as rule `parity` gates its base (per call, and top-1 where logits are declared), and for a
family with a chain check the variant's packages are composed and gated again (Fish: the head's
and the fast AR's greedy codes against upstream's), that verdict in the variant's manifest.
"""
from __future__ import annotations

from pathlib import Path

from anetts import artifacts
from anetts.compile.compress import CompressionError, check_target, resolve_settings
from anetts.workflow import ConfigError, WorkflowConfig, canonical

_PKG = Path(__file__).parent
VARIANT_KEYS = ("stages", "overrides", "gate", "in_all")


class VariantConfig:
    def __init__(self, config: dict, wf: WorkflowConfig):
        self.wf = wf
        self.variants = dict(config.get("variants") or {})
        # every (model, variant, stage) resolves now, so a bad key fails before any job runs
        for name in self.variants:
            models = [m for m in wf.model_names if self.applies(m, name)]
            if not models:
                v = self._variant(name)
                raise ConfigError(f"variants.{name}.stages: {v.get('stages')} are not all compressible stages of any "
                                  f"model; stages: { {m: self._compressible(m) for m in wf.model_names} }")
            for model in models:
                for stage in self.stages(model, name):
                    self.settings(model, name, stage)

    def _compressible(self, model: str) -> list[str]:
        """Stage names a variant may list: every stage, and a repeated stage's declared name."""
        decl = self.wf.decl(model)
        return [*self.wf.stages(model), *sorted({decl.stage(s).name for s in self.wf.stages(model)})]

    def _expand(self, model: str, names) -> list[str]:
        """Listed names as stage instances (a repeated stage's declared name → all its instances)."""
        decl = self.wf.decl(model)
        return [s for s in self.wf.stages(model) if s in names or decl.stage(s).name in names]

    def applies(self, model: str, name: str) -> bool:
        """A variant belongs to the models whose compressible stages include all it names (all stages
        when it names none: then only to models without other stages)."""
        v = self._variant(name)
        ok = self._compressible(model)
        wanted = [*v.get("stages", self.wf.stages(model)), *v.get("overrides", {})]
        return bool(ok) and all(s in ok for s in wanted)

    def names_for(self, model: str) -> list[str]:
        return [n for n in self.names if self.applies(model, n)]

    @property
    def names(self) -> list[str]:
        return sorted(self.variants)

    def _variant(self, name: str) -> dict:
        if name not in self.variants:
            raise ConfigError(f"variants.{name}: no such variant; configured: {self.names}")
        return self.variants[name]

    def stages(self, model: str, name: str) -> list[str]:
        """The stages `name` compresses, in the model's stage order."""
        v = self._variant(name)
        model_stages = self.wf.stages(model)
        listed = v.get("stages", model_stages)
        known = self._compressible(model)
        for s in [*listed, *v.get("overrides", {})]:
            if s not in known:
                key = "stages" if s in listed else f"overrides.{s}"
                raise ConfigError(f"variants.{name}.{key}: {s!r} is not a stage of {model}; stages: {known}")
        chosen = self._expand(model, listed)
        unused = [s for s in v.get("overrides", {}) if not set(self._expand(model, [s])) <= set(chosen)]
        if unused:
            raise ConfigError(f"variants.{name}.overrides.{unused[0]}: stage is not in variants.{name}.stages {listed}")
        return chosen

    def _override(self, model: str, name: str, stage: str) -> tuple[str | None, dict]:
        """(key, settings) of the override that applies to `stage`: its own name before its declared name."""
        overrides = self._variant(name).get("overrides", {})
        for key in (stage, self.wf.decl(model).stage(stage).name):
            if key in overrides:
                return key, overrides[key]
        return None, {}

    def settings(self, model: str, name: str, stage: str) -> dict:
        v = self._variant(name)
        base = {k: val for k, val in v.items() if k not in VARIANT_KEYS}
        key, override = self._override(model, name, stage)
        where = f"variants.{name}" if key is None else f"variants.{name}.overrides.{key}"
        if "mode" in override and override["mode"] != base.get("mode"):
            base = {}  # another mode: none of the variant's own mode-specific keys apply
        try:
            s = resolve_settings({**base, **override}, where)
            check_target(s, self.wf.convert_options(model, stage)["deployment_target"], where, stage)
        except CompressionError as e:
            raise ConfigError(str(e)) from None
        return canonical(s)

    def gate(self, model: str, name: str, stage: str) -> dict:
        return canonical({**self.wf.parity_gate(model, stage), **self._variant(name).get("gate", {})})

    def in_all(self) -> list[str]:
        return [n for n in self.names if self.variants[n].get("in_all", False)]

    # -- rule inputs -------------------------------------------------------------------------
    def code(self) -> list[str]:
        # scored as rule parity scores the package (WF.parity_code: every export is a scenario)
        return self.wf._rel([_PKG / "compile" / "compress.py", _PKG / "compile" / "inspect.py", _PKG / "compile" / "macs.py",
                             _PKG / "compile" / "spec_walk.py",
                             *self.wf.parity_code()])

    def compressed(self, model: str, name: str, stage: str) -> bool:
        return stage in self.stages(model, name)

    def _per_package(self, model: str, name: str, variant_path, base_path) -> list[str]:
        return [str(variant_path(model, name, s, b) if self.compressed(model, name, s) else base_path(model, s, b))
                for s in self.wf.stages(model) for b in self.wf.buckets(model, s)]

    def packages(self, model: str, name: str) -> list[str]:
        """Every package of the variant's manifest: compressed where configured, else the base one."""
        return self._per_package(model, name, artifacts.variant_package_path, artifacts.package_path)

    def package_reports(self, model: str, name: str) -> list[str]:
        return self._per_package(model, name, artifacts.variant_package_report, artifacts.package_report)

    def parity_reports(self, model: str, name: str) -> list[str]:
        return self._per_package(model, name, artifacts.variant_parity_path, artifacts.parity_path)

    # -- the variant's compiled chain (families with a chain check): rule variant_chain_parity
    def chain_buckets(self, model: str, name: str) -> list[str]:
        """The model's chain buckets where the variant compresses at least one composed stage."""
        if not self.wf.has_chain(model):
            return []
        return [Path(p).stem for p in self.wf.chain_reports(model)
                if any(self.compressed(model, name, s) for s in self.wf.chain_stages(model, Path(p).stem))]

    def chain_reports(self, model: str, name: str) -> list[str]:
        return [str(artifacts.variant_chain_path(model, name, b)) for b in self.chain_buckets(model, name)]

    def _chain_each(self, model: str, name: str, bucket: str, variant_path, base_path) -> list[str]:
        return [str(variant_path(model, name, s, bucket) if self.compressed(model, name, s) else base_path(model, s, bucket))
                for s in self.wf.chain_stages(model, bucket)]

    def chain_packages(self, model: str, name: str, bucket: str) -> list[str]:
        return self._chain_each(model, name, bucket, artifacts.variant_package_path, artifacts.package_path)

    def chain_parity_inputs(self, model: str, name: str, bucket: str) -> list[str]:
        return self._chain_each(model, name, bucket, artifacts.variant_parity_path, artifacts.parity_path)

    def chain_package_reports(self, model: str, name: str, bucket: str) -> list[str]:
        return self._chain_each(model, name, bucket, artifacts.variant_package_report, artifacts.package_report)

    def chain_gate(self, model: str, name: str) -> dict:
        """The model's chain gate with the variant's own gate keys over it."""
        return canonical({**self.wf.chain_gate(model), **self._variant(name).get("gate", {})})

    def compressed_reports(self, model: str, names: list[str] | None = None) -> list[str]:
        return [str(artifacts.variant_package_report(model, n, s, b)) for n in (names or self.names_for(model))
                for s in self.stages(model, n) for b in self.wf.buckets(model, s)]

    def summary_inputs(self, model: str) -> dict:
        """Per variant of `model`: what its summary totals read (rule variants_summary)."""
        return {n: {"reports": self.package_reports(model, n), "packages": self.packages(model, n),
                    "chain": self.chain_reports(model, n),
                    "settings": {s: self.settings(model, n, s) for s in self.stages(model, n)}}
                for n in self.names_for(model)}

    def summary_code(self, model: str) -> list[str]:
        return self.wf._rel([_PKG / "compile" / "variants_report.py", *self.wf.decl(model).frame_cost_paths()])

    def manifests(self, model: str, names: list[str] | None = None) -> list[str]:
        return [str(artifacts.variant_manifest_path(model, n)) for n in (self.names if names is None else names)]

    def targets(self, model: str, names: list[str] | None = None) -> list[str]:
        """What `snakemake variants` (all names) or `all` (the in_all ones) builds."""
        mine = self.names_for(model)
        names = mine if names is None else [n for n in names if n in mine]
        # the summary compares every variant of the model, so it is built only when all of them are
        summary = [str(artifacts.variants_summary_path(model))] if names and set(names) == set(mine) else []
        return [*self.manifests(model, names), *summary]
