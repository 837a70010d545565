"""The validated config as the Snakefile sees it: model/stage/bucket lists and rule parameters.

Rules stay declarative; everything they compute from config lives here, importable and tested.
"""
from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

from dataclasses import asdict

from anetts import artifacts, options
from anetts.family import bucket_regex
from anetts.families import declaration
from anetts.options import ConvertOptions, Gate, stage_build_keys
from anetts.provenance import version_of

_PKG = Path(__file__).parent


class ConfigError(ValueError):
    pass


def canonical(value):
    """Dicts with sorted keys, recursively: Snakemake compares params by repr(), so key order in
    config.yaml must not look like a change."""
    if isinstance(value, dict):
        return {k: canonical(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    return value


# A model's blocks that lie over its family's (key by key). Snakemake's `validate` fills schema
# defaults into every object it checks, which would turn "not set for this model" into "the
# default" and silently override the family's value (a model setting only `buckets` would reset
# its stage's deployment_target to macOS13), so these blocks keep what the config wrote.
MODEL_OVERLAYS = ("stages", "end_to_end")
SCHEMA_PATH = options.SCHEMA


def check_yaml_syntax(path: str | Path) -> None:
    """A YAML syntax error in `path` as a ConfigError with its line and column (Snakemake's own
    message for a config file it cannot parse names neither)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        return  # Snakemake names a missing config file itself
    try:
        # libyaml's loader where PyYAML has it (every parse, no-op runs too, pays this); same marks
        yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.MarkedYAMLError as e:
        def at(mark):
            return f"line {mark.line + 1}, column {mark.column + 1}"

        where = at(e.problem_mark or e.context_mark)
        context = f" ({e.context} at {at(e.context_mark)})" if e.context and e.context_mark else ""
        raise ConfigError(f"{path}: YAML syntax error at {where}: {e.problem or e.context}{context}") from None


@functools.lru_cache(maxsize=1)
def _default_filling_validator():
    """Draft 2020-12 with schema defaults filled into every object it checks: what Snakemake's
    `snakemake.utils.validate` does (the jsonschema FAQ's recipe), without its schema re-read through
    yte and pure-Python YAML, which was most of a no-op run's config cost (benchmarks/results/startup_log.md, round 2)."""
    from jsonschema import Draft202012Validator, validators

    check_properties = Draft202012Validator.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        for name, subschema in properties.items():
            if "default" in subschema:
                instance.setdefault(name, copy.deepcopy(subschema["default"]))  # the schema is shared
        yield from check_properties(validator, properties, instance, schema)

    return validators.extend(Draft202012Validator, {"properties": set_defaults})


def validate_config(config: dict, schema_path: Path = SCHEMA_PATH) -> dict:
    """Validate `config` against the schema (defaults filled in), leaving a model's overlay blocks as
    written. Bad input: Snakemake's WorkflowError around the schema's message, as its `validate` gives."""
    import jsonschema
    from snakemake.exceptions import WorkflowError

    schema = options.schema() if Path(schema_path).resolve() == SCHEMA_PATH else options.load_schema(schema_path)
    written = {m: {k: copy.deepcopy(spec[k]) for k in MODEL_OVERLAYS if k in spec}
               for m, spec in (config.get("models") or {}).items() if isinstance(spec, dict)}
    try:
        _default_filling_validator()(schema).validate(config)
    except jsonschema.ValidationError as e:
        raise WorkflowError("Error validating config file.", e) from None
    for m, blocks in written.items():
        config["models"][m].update(blocks)
    return config


@functools.lru_cache(maxsize=None)
def _relative(path: str, cwd: str) -> str:
    """`path` resolved, relative to `cwd`: the same few dozen source files are named by hundreds of
    rule inputs in one parse, and resolving each again was a tenth of our parse time."""
    return os.path.relpath(Path(path).resolve(), cwd)


class WorkflowConfig:
    def __init__(self, config: dict, root: str | Path = "."):
        self.config = config
        self.root = Path(root).resolve()
        if config["model"] not in config["models"]:
            raise ConfigError(f"config key `model`: {config['model']!r} is not one of models {sorted(config['models'])}")
        for name, m in config["models"].items():
            fam = m["family"]
            if fam not in config["families"]:
                raise ConfigError(f"models.{name}.family: no `families.{fam}` block in config")
            family = declaration(fam)
            for where, block in ((f"families.{fam}.stages", config["families"][fam]["stages"]),
                                 (f"models.{name}.stages", m.get("stages", {}))):
                for stage in block:
                    if stage not in family.stages:
                        raise ConfigError(f"{where}.{stage}: family {fam!r} has no such stage; "
                                          f"stages: {sorted(family.stages)}")
            for stage, settings in self._declared_settings(name).items():
                st = family.stage(stage)
                if st.repeat is not None and not isinstance(settings.get(st.repeat), int):
                    raise ConfigError(f"families.{fam}.stages.{stage}: needs `{st.repeat}` (how many "
                                      f"{stage}<k> stages to make)")
                for key in family.reference_params if st.uses_reference else ():
                    if not config["families"][fam].get(key):
                        raise ConfigError(f"families.{fam}.{key}: stage {stage} is checked on the shared reference "
                                          f"run, which needs it")
        self._check_file_sizes(config["model"])
        declared = sorted({d for m in self.model_names for d in self._declared_settings(m)})
        for stage in config.get("parity", {}).get("stages", {}):
            if stage not in self.stage_names and stage not in declared:
                raise ConfigError(f"parity.stages.{stage}: no configured stage has this name; stages: "
                                  f"{sorted(set(self.stage_names) | set(declared))}")

    def file_bytes(self, model: str, settings: dict | None = None) -> dict[str, int] | None:
        """{stage: weight bytes of its package file} as the family counts them before converting
        (`FamilyDecl.file_bytes`), under `settings` (default: the config's stage blocks); None where
        the family does not count them or the geometry is not known yet."""
        decl = self.decl(model)
        settings = self._declared_settings(model) if settings is None else settings
        if decl.file_bytes is None:
            return None
        weights_dir = self.root / artifacts.weights_dir(model)
        try:
            return decl.hook("file_bytes")(self.config["models"][model]["weights"], weights_dir, settings)
        except ValueError as e:
            raise ConfigError(f"models.{model}: {e}") from None

    def _check_file_sizes(self, model: str) -> None:
        """Refuse, before anything is converted, a layout whose package files the family counts
        above `max_package_mb` (Core ML loads a package's weights as one file: ~2 GB on macOS,
        ~1 GB on iOS), naming the key to change; the convert job checks the real file after."""
        settings = self._declared_settings(model)
        sizes = self.file_bytes(model, settings) or {}
        for stage, n in sizes.items():
            limit = self.convert_options(model, stage)["max_package_mb"]
            if n <= limit * 1e6:
                continue
            decl = self.decl(model).stage(stage)
            own = self.config["models"][model].get("stages", {}).get(decl.name, {})
            block = f"models.{model}" if decl.repeat in own else f"families.{self.family_of(model)}"
            what = f"{stage}'s package would hold {n / 1e6:.0f} MB of weights, above max_package_mb = {limit:g}"
            if decl.repeat is None:
                raise ConfigError(f"{block}.stages.{decl.name}.max_package_mb: {what}")
            count, need = settings[decl.name][decl.repeat], None
            for k in range(count + 1, 4097):  # the smallest count whose largest file fits, if any does
                try:
                    split = self.file_bytes(model, {**settings, decl.name: {**settings[decl.name], decl.repeat: k}})
                except ConfigError:  # past what the family can split (e.g. one layer per chunk)
                    break
                if max(split[f"{decl.name}{i}"] for i in range(k)) <= limit * 1e6:
                    need = k
                    break
            hint = f"; set it to at least {need}" if need else "; no count fits: raise max_package_mb"
            raise ConfigError(f"{block}.stages.{decl.name}.{decl.repeat} = {count}: {what}{hint}")

    # -- names -------------------------------------------------------------------------------
    @property
    def model_names(self) -> list[str]:
        return sorted(self.config["models"])

    @property
    def stage_names(self) -> list[str]:
        """Every stage any model of the config builds (repeated stages as their instances)."""
        return sorted({s for m in self.model_names for s in self.stages(m)})

    def family_of(self, model: str) -> str:
        return self.config["models"][model]["family"]

    @property
    def bucket_regex(self) -> str:
        return bucket_regex(declaration(f) for f in self.config["families"])

    def decl(self, model: str):
        return declaration(self.family_of(model))

    def _declared_settings(self, model: str) -> dict:
        """Per declared stage: the family's config block with the model's own `stages` over it."""
        fam = self.config["families"][self.family_of(model)]["stages"]
        own = self.config["models"][model].get("stages", {})
        return {s: {**fam[s], **own.get(s, {})} for s in fam}

    def _stages(self, model: str) -> dict:
        """Per stage (repeated stages expanded to their instances): its settings."""
        out = {}
        decl = self.decl(model)
        for name, settings in self._declared_settings(model).items():
            for inst in decl.stage(name).instances(settings):
                out[inst] = settings
        return out

    def stages(self, model: str) -> list[str]:
        return list(self._stages(model))

    def stage_params(self, model: str, stage: str) -> dict:
        """What shapes a stage's export besides its bucket: build keys of its config block (the
        validated config has their schema defaults), for an instance of a repeated stage its index
        and the count, and for a stage checked on the shared reference run that run's parameters."""
        st = self.decl(model).stage(stage)
        settings = self._stages(model)[stage]
        keys = stage_build_keys() - {"buckets"}
        params = {k: settings[k] for k in sorted(keys) if k in settings}
        if st.repeat is not None:
            params["index"] = int(stage[len(st.name):])
        if st.uses_reference:
            params.update(self.reference_params(model))
        return canonical(params)

    def buckets(self, model: str, stage: str) -> list[str]:
        st = self.decl(model).stage(stage)
        return [st.bucket_name(size) for size in self._stages(model)[stage]["buckets"]]

    def bucket_size(self, model: str, stage: str, bucket: str) -> int:
        st = self.decl(model).stage(stage)
        for size in self._stages(model)[stage]["buckets"]:
            if st.bucket_name(size) == bucket:
                return size
        raise ConfigError(f"bucket {bucket!r} is not configured for {model}/{stage}; buckets: {self.buckets(model, stage)}")

    # -- rule inputs -------------------------------------------------------------------------
    def _rel(self, paths) -> list[str]:
        # local(): code is part of the workflow's sources (Snakemake ships those to remote jobs),
        # never an object of a default storage provider (--default-storage-provider s3)
        from snakemake.io import local

        cwd = os.getcwd()
        return local(sorted({_relative(str(p), cwd) for p in paths}))

    def weights_code(self, model: str) -> list[str]:
        # each source depends on its own code: editing synthetic-only code never re-copies real weights
        return self._rel(self.decl(model).weights_paths(self.weights_source(model)["source"]))

    def weights_inputs(self, model: str) -> list[str]:
        """Files a weights source reads from disk (an ONNX export), so replacing one rebuilds."""
        src = self.config["models"][model]["weights"]
        if src["source"] != "onnx":
            return []
        voices = os.path.expanduser(src["voices_path"])
        return [os.path.expanduser(src["model"]), *([voices] if voices.endswith((".npz", ".bin")) else [])]

    def stage_code(self, model: str, stage: str) -> list[str]:
        st = self.decl(model).stage(stage)
        # the one export path of every stage (compile/export.py) and what it builds on
        return self._rel([*st.source_paths(), _PKG / "compile" / "export.py", _PKG / "compile" / "reference.py",
                          _PKG / "scenario.py", _PKG / "tensors.py", _PKG / "stage.py", _PKG / "gate.py",
                          _PKG / "metrics.py"])

    def reference_code(self, model: str) -> list[str]:
        return self._rel([*self.decl(model).reference_paths(), _PKG / "compile" / "reference.py"])

    def reference_size(self, model: str, bucket: str) -> int:
        """Size of a shared reference bucket: any reference-using stage that has this bucket."""
        family = self.decl(model)
        for stage in self.stages(model):
            if family.stage(stage).uses_reference and bucket in self.buckets(model, stage):
                return self.bucket_size(model, stage, bucket)
        raise ConfigError(f"no stage of {model} uses a reference at bucket {bucket!r}")

    def export_reference(self, model: str, stage: str, bucket: str) -> list[str]:
        """The reference npz an export reads, or nothing for stages that make their own examples."""
        if not self.decl(model).stage(stage).uses_reference:
            return []
        return [str(artifacts.reference_path(model, bucket))]

    def assets_code(self, model: str) -> list[str]:
        return self._rel([*self.decl(model).assets_paths(), _PKG / "compile" / "assets.py"])

    def parity_code(self) -> list[str]:
        """The verifying code (one path for every package: its export's scenario played and scored)
        and the executors it runs packages on."""
        return self._rel([_PKG / "verify" / "parity.py", _PKG / "gate.py", _PKG / "metrics.py", _PKG / "scenario.py",
                          _PKG / "tensors.py", _PKG / "options.py", _PKG / "runtime" / "runners.py"])

    def bundle_parity_code(self) -> list[str]:
        """parity's code and the program comparison that spares a bundle's functions their runs."""
        return self.parity_code() + self._rel([_PKG / "mil" / "compare.py"])

    def summary_code(self) -> list[str]:
        return self._rel([_PKG / "verify" / "summary.py"])

    def manifest_code(self, model: str) -> list[str]:
        """The manifest's writer, the ANE-eligible share it records and the family's seconds-per-bucket hook."""
        return self._rel([_PKG / "compile" / "manifest.py", _PKG / "compile" / "ane_share.py",
                          *self.decl(model).audio_seconds_paths()])

    def report_code(self) -> list[str]:
        return self._rel([*sorted((_PKG / "report").glob("*.py")), _PKG / "bench.py"])

    def parity_gate(self, model: str, stage: str) -> dict:
        gate = dict(self.config.get("parity", {}).get("default", {}))
        per_stage = self.config.get("parity", {}).get("stages", {})
        gate.update(per_stage.get(self.decl(model).stage(stage).name, {}))  # a repeated stage's, then the instance's
        gate.update(per_stage.get(stage, {}))
        return canonical(asdict(Gate.make(**gate)))

    def parity_arrays_all(self, model: str) -> list[str]:
        return [self.parity_arrays(model, s, b) for s in self.stages(model) for b in self.buckets(model, s)]

    def audio_output(self, model: str) -> dict:
        """The stage output that is audio (plotted by the parity summary), from the declaration."""
        decl = self.decl(model)
        if decl.audio is None or decl.audio[0] not in self.stages(model):
            return {}
        return {"stage": decl.audio[0], "output": decl.audio[1], "sample_rate": decl.audio[2]}

    def parity_reports(self, model: str) -> list[str]:
        return [str(artifacts.parity_path(model, s, b)) for s in self.stages(model) for b in self.buckets(model, s)]

    def convert_code(self) -> list[str]:
        return self._rel([_PKG / "compile" / "convert.py", _PKG / "compile" / "rewrite.py", _PKG / "compile" / "inspect.py",
                          _PKG / "compile" / "macs.py", _PKG / "compile" / "spec_walk.py", _PKG / "compile" / "stamp.py",
                          _PKG / "compile" / "pipeline_trims.py", _PKG / "options.py"])

    def bundle_code(self) -> list[str]:
        return self._rel([_PKG / "compile" / "bundle.py", _PKG / "compile" / "pipeline_trims.py"])

    def bundled_stages(self, model: str) -> list[str]:
        """Stages whose buckets are bundled into one multifunction package (`StageDecl.bundle`)."""
        return [s for s in self.stages(model) if self.decl(model).stage(s).bundle]

    def bundles(self, model: str) -> list[str]:
        return [str(artifacts.bundle_path(model, s)) for s in self.bundled_stages(model)]

    def bundle_reports(self, model: str) -> list[str]:
        return [str(artifacts.bundle_report(model, s)) for s in self.bundled_stages(model)]

    def scenarios(self, model: str) -> list[str]:
        """Per package, the calls its parity played (its export's scenario)."""
        return [str(artifacts.export_files(model, s, b)["scenario"])
                for s in self.stages(model) for b in self.buckets(model, s)]

    def manifested_outputs(self, model: str) -> list[str]:
        """Every build output the manifest lists a file of. Targets of `all` too: Snakemake does not
        rebuild a deleted input of an output it judges up to date (the manifest), only a missing target."""
        return [*self.packages(model), *self.torchscripts(model), *self.scenarios(model), *self.bundles(model),
                str(artifacts.assets_dir(model))]

    def bundle_parity_reports(self, model: str) -> list[str]:
        return [str(artifacts.bundle_parity_path(model, s)) for s in self.bundled_stages(model)]

    # -- the compiled chain (rule chain_parity): the packages composed as the runtime composes them
    def has_chain(self, model: str) -> bool:
        return bool(self.decl(model).chain_code)

    def chain_reports(self, model: str) -> list[str]:
        """One chain check per reference bucket the model's stages share (none if the family has no check);
        stages with examples of their own (Fish's codec) are not part of a chain."""
        if not self.has_chain(model):
            return []
        decl = self.decl(model)
        buckets = sorted({b for s in self.stages(model) if decl.stage(s).uses_reference for b in self.buckets(model, s)})
        return [str(artifacts.chain_parity_path(model, b)) for b in buckets]

    def chain_packages(self, model: str, bucket: str) -> list[str]:
        return [self.package(model, s, bucket) for s in self.chain_stages(model, bucket)]

    def chain_code(self, model: str) -> list[str]:
        return self._rel([*self.decl(model).chain_paths(), _PKG / "verify" / "chain_gate.py", _PKG / "gate.py",
                          _PKG / "metrics.py", _PKG / "options.py"])

    def chain_settings(self, model: str) -> dict:
        """The model's `chain` block (the family's chain check names and defaults its keys)."""
        return canonical(dict(self.config["models"][model].get("chain") or {}))

    def chain_stages(self, model: str, bucket: str) -> list[str]:
        return [s for s in self.stages(model) if bucket in self.buckets(model, s)]

    def chain_parity_inputs(self, model: str, bucket: str) -> list[str]:
        return [self.parity_report(model, s, bucket) for s in self.chain_stages(model, bucket)]

    def chain_package_reports(self, model: str, bucket: str) -> list[str]:
        """The packages' convert reports: the chain check's runners load their typed functions."""
        return [str(artifacts.package_report(model, s, bucket)) for s in self.chain_stages(model, bucket)]

    def job_imports(self, model: str) -> list[str]:
        """What the build's job server imports for `model`'s jobs (anetts.jobserver)."""
        return list(self.decl(model).job_imports)

    def chain_gate(self, model: str) -> dict:
        """The compiled chain is held to the default gate (per-stage overrides do not apply to it)."""
        return canonical(asdict(Gate.make(**self.config.get("parity", {}).get("default", {}))))

    # -- end to end (rule end_to_end): the runtime over the compiled packages vs upstream, fixed texts
    def end_to_end_settings(self, model: str) -> dict | None:
        """The family's `end_to_end` block with the model's over it (gate merged key by key), or None
        when the family declares no check or the model turns it off (`end_to_end: {enabled: false}`)."""
        if not self.decl(model).end_to_end_code:
            return None
        fam = dict(self.config["families"][self.family_of(model)].get("end_to_end") or {})
        own = dict(self.config["models"][model].get("end_to_end") or {})
        merged = {**fam, **own, "gate": {**fam.get("gate", {}), **own.get("gate", {})}}
        if not merged.pop("enabled", True):
            return None
        return canonical(merged)

    def end_to_end_reports(self, model: str) -> list[str]:
        return [str(artifacts.end_to_end_path(model))] if self.end_to_end_settings(model) else []

    def end_to_end_params(self, model: str) -> dict:
        return {k: v for k, v in self.end_to_end_settings(model).items() if k != "gate"}

    def end_to_end_gate(self, model: str) -> dict:
        return self.end_to_end_settings(model)["gate"]

    def end_to_end_code(self, model: str) -> list[str]:
        runtime = sorted((_PKG / "runtime").glob("*.py"))
        return self._rel([*self.decl(model).end_to_end_paths(), *runtime, _PKG / "loader.py",
                          _PKG / "verify" / "end_to_end.py", _PKG / "gate.py", _PKG / "compile" / "manifest.py"])

    # -- listening (rule listen): the corpus through upstream and the build, judged as a listener would
    def listen_settings(self, model: str) -> dict | None:
        """The model's `listen` block, or None when it has none (the synthetic presets: their upstream
        speaks no words) or its family has no listener check."""
        own = self.config["models"][model].get("listen")
        if not own or not self.decl(model).listen:
            return None
        return canonical(dict(own))

    def listen_reports(self, model: str) -> list[str]:
        return [str(artifacts.listen_path(model))] if self.listen_settings(model) else []

    def listen_code(self, model: str) -> list[str]:
        runtime = sorted((_PKG / "runtime").glob("*.py"))
        return self._rel([*self.decl(model).listen_paths(), *runtime, _PKG / "loader.py", _PKG / "compile" / "manifest.py",
                          _PKG / "verify" / "end_to_end.py", _PKG / "gate.py"])  # gate.py: the verdict writer

    def reference_params(self, model: str) -> dict:
        """Parameters of the shared reference run beyond its bucket size (`FamilyDecl.reference_params`)."""
        fam = self.config["families"][self.family_of(model)]
        return {k: fam[k] for k in self.decl(model).reference_params}

    def package(self, model: str, stage: str, bucket: str) -> str:
        return str(artifacts.package_path(model, stage, bucket))

    def parity_report(self, model: str, stage: str, bucket: str) -> str:
        return str(artifacts.parity_path(model, stage, bucket))

    def parity_arrays(self, model: str, stage: str, bucket: str) -> str:
        return str(artifacts.arrays_beside(artifacts.parity_path(model, stage, bucket)))

    def inspect_reports(self, model: str) -> list[str]:
        return [str(artifacts.inspect_path(model, s, b)) for s in self.stages(model) for b in self.buckets(model, s)]

    def package_reports(self, model: str) -> list[str]:
        return [str(artifacts.package_report(model, s, b)) for s in self.stages(model) for b in self.buckets(model, s)]

    def packages(self, model: str) -> list[str]:
        return [str(artifacts.package_path(model, s, b)) for s in self.stages(model) for b in self.buckets(model, s)]

    def export_files(self, model: str, stage: str, bucket: str) -> dict[str, str]:
        """The files of one export, by role (artifacts.export_files), for rules that read other buckets'."""
        return {k: str(p) for k, p in artifacts.export_files(model, stage, bucket).items()}

    def torchscripts(self, model: str) -> list[str]:
        """Per package, its traced export: a folder with one TorchScript per function."""
        return [str(artifacts.export_files(model, s, b)["functions"])
                for s in self.stages(model) for b in self.buckets(model, s)]

    # -- Core AI assets (rules/aimodel.smk) ---------------------------------------------------
    def aimodel_in_all(self) -> bool:
        return bool(self.config.get("aimodel", {}).get("in_all", False))

    def aimodel_stages(self, model: str) -> list[str]:
        """Stages that get a `.aimodel` (config `aimodel.stages`, default all)."""
        wanted = self.config.get("aimodel", {}).get("stages")
        stages = self.stages(model)
        if wanted is None:
            return stages
        unknown = sorted(set(wanted) - set(stages))
        if unknown:
            raise ConfigError(f"aimodel.stages: {unknown} are not stages of {model}; stages: {stages}")
        return [s for s in stages if s in wanted]

    def aimodel_code(self, model: str, stage: str) -> list[str]:
        # the asset is a fresh torch.export of the stage wrapper, so the stage's code is an input
        return self._rel([*self.stage_code(model, stage), _PKG / "compile" / "aimodel.py", _PKG / "compile" / "stamp.py"])

    def aimodel_parity_code(self) -> list[str]:
        return self._rel([_PKG / "verify" / "aimodel_parity.py", *self.parity_code()])

    def aimodel_parity_reports(self, model: str) -> list[str]:
        return [str(artifacts.aimodel_parity_path(model, s, b)) for s in self.aimodel_stages(model)
                for b in self.buckets(model, s)]

    # -- rule params -------------------------------------------------------------------------
    def weights_source(self, model: str) -> dict:
        src = dict(self.config["models"][model]["weights"])
        if src["source"] == "synthetic":
            src.setdefault("seed", 0)
        return canonical(src)

    def convert_options(self, model: str, stage: str) -> dict:
        build = stage_build_keys()
        st = {k: v for k, v in self._stages(model)[stage].items() if k not in build}
        opts = asdict(ConvertOptions.make(**st))
        opts["fatal_lint"] = list(opts["fatal_lint"])
        return canonical(opts)

    def stage_settings(self, model: str) -> dict:
        return canonical({s: {**self.convert_options(model, s), "buckets": self.buckets(model, s),
                              **self.stage_params(model, s)}
                          for s in self.stages(model)})

    def model_meta(self, model: str) -> dict:
        src = self.weights_source(model)
        revision = src.get("revision") or (f"{src['preset']}-seed{src['seed']}" if src["source"] == "synthetic" else None)
        return {"model": model, "family": self.family_of(model), "source": src["source"],
                "repo_id": src.get("repo_id"), "revision": revision, "licence": self.decl(model).licence}

    def upstream_versions(self, model: str) -> dict:
        """Versions of torch and the family's upstream packages: a rule param, so upgrading one reruns its jobs."""
        return self.versions("torch", *self.decl(model).upstream)

    # -- publishing ---------------------------------------------------------------------------
    def publish_target(self) -> dict:
        """Where `snakemake publish` commits: `hf_repo` (the --config shortcut) over `publish.repo_id`."""
        pub = self.config.get("publish") or {}
        repo_id = self.config.get("hf_repo") or pub.get("repo_id")
        if not repo_id:
            raise ConfigError("publishing needs a Hub repo: --config hf_repo=OWNER/NAME (or publish.repo_id in config.yaml)")
        return canonical({"repo_id": repo_id, "revision": pub.get("revision", "main"), "private": bool(pub.get("private", False))})

    def publish_code(self) -> list[str]:
        return self._rel([_PKG / "publish" / f for f in ("layout.py", "upload.py")])

    @staticmethod
    def versions(*names: str) -> dict:
        return {n: version_of(n) for n in names}
