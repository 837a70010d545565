"""Read ``artifacts/<model>/manifest.json``: packages, their I/O and geometry, integrity, bucket choice.

The manifest is the only thing the runtime trusts about a model directory. Loading checks that
every path it lists stays inside the model directory (:func:`manifest_paths`, shared by `anetts
verify` and publishing, since all of them open or remove what it lists), its structure and that
every listed file exists (cheap); the sha256 of a package is checked lazily,
the first time a backend uses it (:meth:`ModelArtifacts.verify`), so starting up stays fast and a
tampered package still fails before it runs.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from anetts.artifacts import tree_sha256
from anetts.families import declaration
from anetts.runtime.errors import ArtifactError, IntegrityError
from anetts.tensors import FunctionSpec, TensorSpec

MANIFEST_NAME = "manifest.json"
# 2: runtime assets listed; 3: every package (and bundle) lists its typed functions (I/O and states);
# 4: every package's `torchscript` is a folder of <function>.pt and its `scenario` the calls parity
# played (3 listed a stateless bucket's `.pt` and `example_inputs` npz)
MANIFEST_VERSION = 4


def unreadable_version(manifest: dict) -> str | None:
    """Why this anetts cannot read `manifest`'s format, else None. Only this version is read: an
    older manifest lacks the typed functions the runtime runs, or lists exports in another layout,
    so the model must be rebuilt."""
    version = manifest.get("manifest_version")
    if isinstance(version, bool) or not isinstance(version, int):
        return f"manifest_version {version!r} is not a version this anetts knows (it reads {MANIFEST_VERSION})"
    if version > MANIFEST_VERSION:
        return (f"manifest_version {version} is newer than this anetts reads ({MANIFEST_VERSION}); "
                f"upgrade anetts or rebuild the model")
    if version < MANIFEST_VERSION:
        return (f"manifest_version {version} is older than this anetts reads ({MANIFEST_VERSION}); "
                f"rebuild the model (`snakemake all`)")
    return None


def bundles_supported(deployment_target: str) -> bool:
    """Multifunction packages need macOS15 / iOS18 or later."""
    for prefix, first in (("macOS", 15), ("iOS", 18)):
        if deployment_target.startswith(prefix):
            try:
                return int(deployment_target[len(prefix):]) >= first
            except ValueError:
                break
    raise ArtifactError(f"unknown deployment target {deployment_target!r}; expected e.g. macOS14, macOS15, iOS18")


def contained_path(root: Path, rel, what: str, error: type[Exception] = ArtifactError, *,
                   inside: Path | None = None, resolves_inside: Path | None = None) -> Path:
    """``root / rel`` for a path a manifest lists, once it cannot reach outside; else ``error`` naming ``what``.

    ``rel`` must be a relative POSIX path in normal form (no ``.``/empty part, no backslash, no ``..``
    except leading ones that stay inside ``inside``, default ``root``), and the path, every symlink on
    the way followed, must resolve inside ``resolves_inside`` (default ``inside``). Existence is not
    checked: callers say what a missing file means to them.
    """
    inside = Path(inside if inside is not None else root)
    if not isinstance(rel, str) or not rel:
        raise error(f"{what}: path {rel!r} is not a non-empty string")
    if os.path.isabs(rel) or "\\" in rel or os.path.normpath(rel) != rel or rel == ".":
        raise error(f"{what}: path {rel!r} is not a normalized relative path (no absolute path, no '.', "
                    f"'..' inside it or backslash); a manifest may only list files inside its model directory")
    path = Path(root) / rel
    lexical, bound = Path(os.path.normpath(path)), Path(os.path.normpath(inside))
    if lexical == bound or not lexical.is_relative_to(bound):
        raise error(f"{what}: path {rel!r} points outside the model directory {inside}")
    bound = Path(resolves_inside if resolves_inside is not None else inside).resolve()
    real = path.resolve()  # follows every symlink on the way, the file's own too
    if real == bound or not real.is_relative_to(bound):
        raise error(f"{what}: path {rel!r} resolves to {real}, outside {bound} (a symlink out of the model directory)")
    return path


# Where a build manifest (anetts.compile.manifest.build_manifest) names files: lists of entries and
# the keys of each that hold a path (dotted: nested).
PATH_KEYS = {
    "packages": ("path", "torchscript", "scenario", "parity.report"),
    "bundles": ("path", "parity.report"),
    "assets": ("path", "output"),  # output: the build output `verify --repair` removes with it
    "chain": ("report",),
    "end_to_end": ("report",),
}


def model_root(model_dir: Path, manifest: dict) -> Path:
    """The directory a manifest's paths must stay in: the model dir, or for a variant
    (``<model>/variants/<name>/``, `anetts.artifacts.variant_dir`) its model's dir, whose
    uncompressed packages and weights it lists as ``../../<path>``."""
    model_dir = Path(model_dir)
    if isinstance(manifest.get("variant"), dict) and model_dir.parent.name == "variants":
        return model_dir.parent.parent
    return model_dir


def manifest_paths(model_dir: Path, manifest: dict, where: str, error: type[Exception] = ArtifactError, *,
                   inside: Path | None = None, resolves_inside: Path | None = None) -> list[tuple[str, Path]]:
    """(entry, path) of every path a build manifest lists, each checked by :func:`contained_path`.

    Called wherever a manifest is read, before anything it lists is opened or removed. ``inside``:
    default :func:`model_root`; ``resolves_inside``: where symlinks may lead (a Hub download's
    files are links into its cache's blob store). A malformed entry is left to the caller's
    structure checks; a path-valued key that is not a safe path is ``error`` naming the entry.
    """
    if not isinstance(manifest, dict):
        raise error(f"{where}: expected a JSON object")
    model_dir = Path(model_dir)
    inside = model_root(model_dir, manifest) if inside is None else inside
    found = []
    if "weights_dir" in manifest:
        found.append((f"{where} weights_dir", manifest["weights_dir"]))
    for section, keys in PATH_KEYS.items():
        entries = manifest.get(section) or []
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            for key in keys:
                value = entry
                for part in key.split("."):
                    value = value.get(part) if isinstance(value, dict) else None
                if value is not None:
                    found.append((f"{where} {section}[{i}].{key}", value))
    return [(what, contained_path(model_dir, rel, what, error, inside=inside, resolves_inside=resolves_inside))
            for what, rel in found]


def _function(d: dict, where: str) -> FunctionSpec:
    """A manifest function entry as the build's own FunctionSpec; a malformed one is an ArtifactError."""
    try:
        return FunctionSpec.from_json(d)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ArtifactError(f"{where}: bad function entry ({type(e).__name__}: {e})") from e


@dataclass(frozen=True)
class PackageEntry:
    """One stage at one bucket, as the manifest lists it (paths resolved against the model dir).

    `functions`: the package's typed entry points (a bundle's: every bucket's); `function`: the one
    this bucket runs by default (a Kokoro bucket: `main`, or its bundle function; a Fish slow chunk:
    `prefill`). Geometry and states come from here, never from names."""

    stage: str
    bucket: str
    function: str
    functions: tuple[FunctionSpec, ...]
    path: Path  # the .mlpackage
    sha256: str
    geometry: dict[str, int]
    compute_units: str | None
    torchscript: Path | None
    torchscript_sha256: str | None = None
    scenario: Path | None = None  # the calls its parity played (anetts bench times them)
    aimodel: Path | None = None  # a Core AI asset of the same program (none listed by manifests yet)

    @property
    def key(self) -> tuple[str, str]:
        return (self.stage, self.bucket)

    @property
    def label(self) -> str:
        return f"{self.stage}/{self.bucket}"

    def spec(self, function: str | None = None) -> FunctionSpec:
        """The typed function `function` (default: the bucket's own)."""
        name = function or self.function
        for f in self.functions:
            if f.name == name:
                return f
        raise ArtifactError(f"{self.label} has no function {name!r}; functions: {[f.name for f in self.functions]}")

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self.spec().inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self.spec().outputs

    @property
    def tokens(self) -> int:
        return int(self.geometry["tokens"])

    @property
    def frames(self) -> int:
        """40 Hz duration frames of a seconds bucket."""
        return int(self.geometry["frames"])

    def input(self, name: str) -> TensorSpec:
        for t in self.inputs:
            if t.name == name:
                return t
        raise ArtifactError(f"{self.label} has no input {name!r}")


def _require(d: dict, key: str, where: str) -> Any:
    if key not in d:
        raise ArtifactError(f"{where}: missing key {key!r}")
    return d[key]


@dataclass
class ModelArtifacts:
    """A built model directory as described by its manifest."""

    model_dir: Path
    manifest: dict
    packages: dict[tuple[str, str], PackageEntry]
    assets: dict[str, tuple[Path, str]]  # name -> (path, sha256): the runtime's files besides packages
    _verified: set = field(default_factory=set, repr=False)
    _hashes: dict = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # ----------------------------------------------------------------- loading

    @classmethod
    def load(cls, model_dir: str | Path, deployment_target: str | None = None, *,
             resolves_inside: Path | None = None) -> "ModelArtifacts":
        """``deployment_target``: the oldest OS the caller must run on. From macOS15/iOS18 on, stages
        run from their multifunction bundle (one package, weights shared across buckets); older
        targets, or None, use the per-bucket packages. ``resolves_inside``: where the listed files'
        symlinks may lead (default: the model dir; a Hub download's lead into its cache)."""
        model_dir = Path(model_dir).expanduser()
        if model_dir.is_file() and model_dir.name == MANIFEST_NAME:
            model_dir = model_dir.parent
        path = model_dir / MANIFEST_NAME
        if not path.is_file():
            hint = " (build it with `snakemake all -c2`)" if model_dir.exists() else ""
            raise ArtifactError(f"no manifest at {path}{hint}")
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ArtifactError(f"cannot read manifest {path}: {e}") from e
        return cls.from_manifest(model_dir, manifest, deployment_target, where=str(path),
                                 resolves_inside=resolves_inside)

    @classmethod
    def from_manifest(cls, model_dir: str | Path, manifest: dict, deployment_target: str | None = None,
                      where: str = "manifest", resolves_inside: Path | None = None) -> "ModelArtifacts":
        """A manifest already in memory (`anetts.compile.manifest.build_manifest`), paths relative to `model_dir`."""
        model_dir = Path(model_dir)
        if not isinstance(manifest, dict):
            raise ArtifactError(f"{where}: expected a JSON object")
        if (why := unreadable_version(manifest)) is not None:
            raise ArtifactError(f"{where}: {why}")
        manifest_paths(model_dir, manifest, where, resolves_inside=resolves_inside)
        family = _require(manifest, "family", where)
        try:
            declared = tuple(declaration(family).stages)
        except KeyError as e:
            raise ArtifactError(f"{where}: {e.args[0]}") from None
        # the build's stages (a repeated stage as its instances, slow_chunk0..N-1), else the declaration's
        stages = tuple(manifest.get("stages") or declared)

        packages: dict[tuple[str, str], PackageEntry] = {}
        for i, p in enumerate(_require(manifest, "packages", where)):
            entry = cls._entry(model_dir, p, f"{where} packages[{i}]")
            if entry.key in packages:
                raise ArtifactError(f"{where}: package {entry.label} listed twice")
            packages[entry.key] = entry
        for stage in stages:
            if not any(k[0] == stage for k in packages):
                raise ArtifactError(f"{where}: no package for stage {stage!r}")

        if deployment_target is not None and bundles_supported(deployment_target):
            packages = cls._from_bundles(model_dir, manifest, packages, where)
        assets = {}
        for i, a in enumerate(_require(manifest, "assets", where)):
            name, rel = str(_require(a, "name", f"{where} assets[{i}]")), str(_require(a, "path", f"{where} assets[{i}]"))
            if not (model_dir / rel).is_file():
                raise ArtifactError(f"runtime asset {name!r} is missing: {model_dir / rel} (listed in the manifest)")
            assets[name] = (model_dir / rel, str(_require(a, "sha256", f"{where} assets[{i}]")))
        return cls(model_dir, manifest, packages, assets)

    @staticmethod
    def _from_bundles(model_dir: Path, manifest: dict, packages: dict, where: str) -> dict:
        """Each bucket of a bundled stage as a function of its stage's bundle."""
        out = dict(packages)
        for i, b in enumerate(manifest.get("bundles", [])):
            at = f"{where} bundles[{i}]"
            stage = str(_require(b, "stage", at))
            path = model_dir / str(_require(b, "path", at))
            if not path.exists():
                raise ArtifactError(f"bundle of {stage} is missing: {path} (listed in the manifest)")
            functions = tuple(_function(f, at) for f in _require(b, "functions", at))
            names = {f.name for f in functions}
            for function, bucket in _require(b, "buckets", at).items():
                if (stage, bucket) not in packages:
                    raise ArtifactError(f"{where}: bundle {stage} has function {function} for unlisted bucket {bucket}")
                if function not in names:
                    raise ArtifactError(f"{at}: bucket {bucket}'s function {function!r} is not among its functions")
                out[(stage, bucket)] = replace(packages[(stage, bucket)], path=path, function=str(function),
                                               functions=functions, sha256=str(_require(b, "sha256", at)))
        return out

    @staticmethod
    def _entry(model_dir: Path, p: dict, where: str) -> PackageEntry:
        stage = str(_require(p, "stage", where))
        bucket = str(_require(p, "bucket", where))
        where = f"{where} ({stage}/{bucket})"
        pkg = model_dir / str(_require(p, "path", where))
        if not pkg.exists():
            raise ArtifactError(f"package {stage}/{bucket} is missing: {pkg} (listed in the manifest)")
        ts_rel = p.get("torchscript")  # only the torch backend needs it; it says so when absent
        sc = p.get("scenario")
        functions = tuple(_function(f, where) for f in _require(p, "functions", where))
        function = str(_require(p, "function", where))
        if function not in {f.name for f in functions}:
            raise ArtifactError(f"{where}: function {function!r} is not among its functions "
                                f"{[f.name for f in functions]}")
        return PackageEntry(
            stage=stage,
            bucket=bucket,
            function=function,
            functions=functions,
            path=pkg,
            sha256=str(_require(p, "sha256", where)),
            geometry={k: int(v) for k, v in _require(p, "geometry", where).items()},
            compute_units=p.get("compute_units"),
            torchscript=model_dir / ts_rel if ts_rel else None,
            torchscript_sha256=p.get("torchscript_sha256"),
            scenario=model_dir / sc if sc else None,
        )

    # ----------------------------------------------------------------- lookup

    @property
    def name(self) -> str:
        return str(self.manifest.get("model", self.model_dir.name))

    def package(self, stage: str, bucket: str) -> PackageEntry:
        try:
            return self.packages[(stage, bucket)]
        except KeyError:
            raise ArtifactError(f"the manifest lists no package {stage}/{bucket}; have {self.buckets(stage)}") from None

    def entries(self, stage: str) -> list[PackageEntry]:
        """The stage's packages, smallest bucket first (by its geometry: tokens, frames or KV context)."""
        es = [e for (s, _), e in self.packages.items() if s == stage]
        return sorted(es, key=lambda e: next((int(e.geometry[k]) for k in ("tokens", "frames", "context")
                                              if k in e.geometry), 0))

    def buckets(self, stage: str) -> list[str]:
        return [e.bucket for e in self.entries(stage)]

    @property
    def family(self) -> str:
        return str(self.manifest["family"])

    @property
    def torchscript_faithful(self) -> bool:
        """Whether the TorchScript exports are this model (a compressed variant's are not: they are
        the uncompressed model its packages were made from)."""
        return not self.manifest.get("variant")

    def asset(self, name: str) -> Path:
        """Path of a runtime asset, its sha256 checked once; IntegrityError naming it on a mismatch."""
        if name not in self.assets:
            raise ArtifactError(f"the manifest lists no runtime asset {name!r}; have {sorted(self.assets)}")
        path, sha = self.assets[name]
        key = ("asset", name)
        if key not in self._verified:
            got = tree_sha256(path)
            if got != sha:
                raise IntegrityError(f"runtime asset {name} ({path}) does not match the manifest: sha256 {got[:12]}... "
                                     f"!= {sha[:12]}...; it was modified or corrupted, rebuild it")
            self._verified.add(key)
        return path

    def asset_names(self, prefix: str = "") -> list[str]:
        return sorted(n for n in self.assets if n.startswith(prefix))

    def stage_compute_units(self, stage: str) -> str | None:
        return (self.manifest.get("stages", {}).get(stage) or {}).get("compute_units")

    # ----------------------------------------------------------------- bucket choice

    def max_tokens(self, stage: str = "duration") -> int:
        return self.entries(stage)[-1].tokens

    def max_frames(self, stages: tuple[str, ...] = ("f0ntrain", "decoder_pre", "generator")) -> int:
        """Frames the largest bucket of *every* frame stage holds (the per-chunk audio limit)."""
        return min(self.entries(s)[-1].frames for s in stages)

    def token_bucket(self, stage: str, n_tokens: int) -> PackageEntry | None:
        """Smallest token bucket with room for ``n_tokens`` (incl. the two wrap tokens), or None."""
        return next((e for e in self.entries(stage) if e.tokens >= n_tokens), None)

    def frame_bucket(self, stage: str, n_frames: int) -> PackageEntry | None:
        """Smallest seconds bucket with at least ``n_frames`` 40 Hz frames, or None."""
        return next((e for e in self.entries(stage) if e.frames >= n_frames), None)

    # ----------------------------------------------------------------- integrity

    def _tree_sha256(self, path: Path) -> str:
        """sha256 of a package, hashed once per path (a bundle serves every bucket of its stage)."""
        got = self._hashes.get(path)
        if got is None:
            got = self._hashes[path] = tree_sha256(path)
        return got

    def verify(self, entry: PackageEntry, torchscript: bool = False) -> None:
        """Check the package's sha256 (and the TorchScript's, when the manifest records one) once.

        Raises :class:`IntegrityError` naming the package on a mismatch.
        """
        key = (entry.key, entry.path, torchscript)
        if key in self._verified:
            return
        with self._lock:
            if key in self._verified:
                return
            got = self._tree_sha256(entry.path)
            if got != entry.sha256:
                raise IntegrityError(
                    f"package {entry.label} ({entry.path}) does not match the manifest: sha256 {got[:12]}... "
                    f"!= {entry.sha256[:12]}...; it was modified or corrupted, rebuild it"
                )
            if torchscript:
                if entry.torchscript is None or not entry.torchscript.exists():
                    raise ArtifactError(f"TorchScript export of {entry.label} is missing: {entry.torchscript}")
                if entry.torchscript_sha256:
                    got = tree_sha256(entry.torchscript)
                    if got != entry.torchscript_sha256:
                        raise IntegrityError(
                            f"TorchScript of {entry.label} ({entry.torchscript}) does not match the manifest: "
                            f"sha256 {got[:12]}... != {entry.torchscript_sha256[:12]}...; rebuild it"
                        )
            self._verified.add(key)
