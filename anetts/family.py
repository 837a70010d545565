"""What a model family declares, without importing torch or any upstream package.

The Snakefile reads only this (stage names, bucket naming, source files per stage, upstream
packages whose versions are rule params, licence, the Hub's licence data), so parsing the workflow
stays cheap and a family's heavy code is imported by the jobs that run it. The implementation
(stage wrappers, weights, reference) lives in the module named by `implementation` and is built on
`anetts.stage`.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path

_PKG = Path(__file__).parent

# bucket unit -> (name of a bucket of `size`, regex matching every such name)
BUCKET_UNITS = {
    "tokens": (lambda size: f"t{size}", r"t\d+"),
    "seconds": (lambda size: f"{size}s", r"\d+s"),
    # KV rows of a stateful stage (its context); stages without one name the reference scenario's context
    "context": (lambda size: f"ctx{size}", r"ctx\d+"),
    # codec frames (Fish: 10 codes in, 2048 samples out per frame)
    "frames": (lambda size: f"f{size}", r"f\d+"),
}

@dataclass(frozen=True)
class StageDecl:
    name: str
    bucket_unit: str  # a key of BUCKET_UNITS
    sources: tuple[str, ...]  # files (relative to anetts/) whose edits must re-export this stage
    uses_reference: bool = False  # examples come from the family's shared per-bucket reference run
    description: str = ""
    # its buckets' one-function packages are merged into one multifunction package (rules bundle,
    # bundle_parity) and have Core AI assets (aimodel); False for a stage whose package holds several
    # functions with states already, in shapes that differ per bucket (Fish's AR stages)
    bundle: bool = True
    # config key whose value N splits this stage into N stages `<name><k>` (k = 0..N-1), e.g. the
    # slow AR's layers in chunks; None: one stage
    repeat: str | None = None

    def __post_init__(self):
        if self.bucket_unit not in BUCKET_UNITS:
            raise ValueError(f"stage {self.name}: unknown bucket unit {self.bucket_unit!r}; known: {sorted(BUCKET_UNITS)}")

    def instances(self, settings: dict) -> list[str]:
        """The stage names this declaration becomes under its config block `settings`."""
        if self.repeat is None:
            return [self.name]
        n = settings.get(self.repeat)
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"stage {self.name}: config key `{self.repeat}` must be a positive integer, got {n!r}")
        return [f"{self.name}{k}" for k in range(n)]

    def bucket_name(self, size: int) -> str:
        return BUCKET_UNITS[self.bucket_unit][0](size)

    @property
    def bucket_regex(self) -> str:
        return BUCKET_UNITS[self.bucket_unit][1]

    def source_paths(self) -> list[Path]:
        return [_PKG / s for s in self.sources]


@dataclass(frozen=True)
class HubCard:
    """What a published build of the family says of its licence on the Hugging Face Hub (anetts.publish)."""

    license: str  # the Hub's licence id, for the model card's front matter
    files: dict[str, str]  # name in the Hub repo -> licence text under anetts/publish/licenses/
    base_model: str  # the upstream checkpoint real weights come from (front matter, real weights only)
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class FamilyDecl:
    name: str
    stages: dict[str, StageDecl]
    implementation: str  # module with `FAMILY` (an anetts.stage.Family)
    runtime: str | None  # "module:Class" the runtime dispatches to for this family's manifests (None: none yet)
    licence: str  # written into every package's metadata and the model card
    upstream: tuple[str, ...]  # distributions whose versions are params of the rules running upstream code
    # per weights source: files (relative to anetts/) whose edits change what that source produces
    weights_code: dict[str, tuple[str, ...]] = field(default_factory=dict)
    reference_code: tuple[str, ...] = ()
    # keys of the config block `families.<name>` that parameterize the shared reference run besides its
    # bucket size (the keyword arguments of `make_reference`; Fish: its decode frames)
    reference_params: tuple[str, ...] = ()
    assets_code: tuple[str, ...] = ()  # code writing the runtime's assets (vocab, voices, ...)
    audio: tuple[str, str, int] | None = None  # (stage, output, sample rate) of the audio a build makes
    # code of the compiled-chain check (the packages composed as the runtime composes them, vs
    # upstream; rule `chain_parity`), or () when the family has none
    chain_code: tuple[str, ...] = ()
    # code of the end-to-end check (the runtime over the compiled packages vs upstream on fixed
    # texts; rule `end_to_end`), or () when the family has none; needs a runtime
    end_to_end_code: tuple[str, ...] = ()
    # "module:function" giving the weight bytes one generated unit reads and the ms it projects to,
    # for the variants summary: f(weights_dir, {stage: compression settings or None}, {stage: weight
    # bytes of its packages}) -> dict; torch-free. None: the family projects no speed.
    frame_cost: str | None = None
    frame_cost_code: tuple[str, ...] = ()
    # module whose `workload(runtime, targets=, voice=, speed=, lang=, upstream=)` gives `anetts bench`
    # its end-to-end cases (anetts.bench.Workload); None: the bench has none for the family
    bench: str | None = None
    # "module:function" giving, before anything is converted, the weight bytes each stage's package
    # file will hold: f(weights source block, weights_dir, {declared stage: its config block}) ->
    # {stage: bytes} or None while the geometry is not known yet (weights not downloaded); torch-free,
    # as the Snakefile calls it. None: the family's files are only checked after converting.
    file_bytes: str | None = None
    # upstream modules most of the family's jobs import, imported once by the build's job server
    # (anetts.jobserver) instead of in every job; "package:submodule" skips the package's __init__
    job_imports: tuple[str, ...] = ()
    # "module:function" judging a build by listening (anetts.listen.gate; rule `listen`, for models that
    # configure `listen`): f(runtime, weights_dir, settings, clips_dir) -> report; None: the family has none
    listen: str | None = None
    listen_code: tuple[str, ...] = ()
    # "module:function" giving the seconds of audio one call of a bucket's package covers, for the
    # manifest's ANE-eligible share (anetts.compile.ane_share): f(stage, geometry) -> seconds;
    # torch-free. None: the share is not defined for the family.
    audio_seconds: str | None = None
    audio_seconds_code: tuple[str, ...] = ()
    # the licence data a Hub repo of the family's builds carries; None: its builds are not published
    hub: HubCard | None = None

    def hook(self, field_name: str):
        """The function a "module:function" field (`runtime`, `frame_cost`, `file_bytes`, `audio_seconds`) names."""
        module, _, name = getattr(self, field_name).partition(":")
        return getattr(importlib.import_module(module), name)

    def stage(self, name: str) -> StageDecl:
        """The declaration of `name`, also of a repeated stage's instance (`slow_chunk1`)."""
        if name in self.stages:
            return self.stages[name]
        m = re.fullmatch(r"(.+?)(\d+)", name)
        if m and m.group(1) in self.stages and self.stages[m.group(1)].repeat is not None:
            return self.stages[m.group(1)]
        raise KeyError(f"family {self.name!r} has no stage {name!r}; stages: {sorted(self.stages)}")

    def chain_paths(self) -> list[Path]:
        return [_PKG / s for s in self.chain_code]

    def end_to_end_paths(self) -> list[Path]:
        return [_PKG / s for s in self.end_to_end_code]

    def listen_paths(self) -> list[Path]:
        return [_PKG / s for s in self.listen_code]

    def audio_seconds_paths(self) -> list[Path]:
        return [_PKG / s for s in self.audio_seconds_code]

    def frame_cost_paths(self) -> list[Path]:
        return [_PKG / s for s in self.frame_cost_code]

    def weights_paths(self, source: str) -> list[Path]:
        if source not in self.weights_code:
            raise KeyError(f"family {self.name!r} has no weights source {source!r}; sources: {sorted(self.weights_code)}")
        return [_PKG / s for s in self.weights_code[source]]

    def reference_paths(self) -> list[Path]:
        return [_PKG / s for s in self.reference_code]

    def assets_paths(self) -> list[Path]:
        return [_PKG / s for s in self.assets_code]


def bucket_regex(decls) -> str:
    """One wildcard constraint matching every bucket name any of `decls`' stages can produce."""
    patterns = sorted({s.bucket_regex for d in decls for s in d.stages.values()})
    return "|".join(f"(?:{p})" for p in patterns)


