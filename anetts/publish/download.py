"""``hf://OWNER/REPO@REVISION``: download one variant of a published model and verify it before use.

The download goes through ``huggingface_hub`` into its usual cache, pinned to the commit the
revision resolves to, limited to the variant's files (``allow_patterns``). Before the runtime sees
the tree, every file of the variant is checked against the repo's ``manifest.json`` (present, size,
sha256), no file is a Git-LFS pointer, no ``.partial``/``.incomplete`` leftovers exist, and every
``.mlpackage`` has its ``Manifest.json``: the failures users of other Core ML repos meet as a
"complete" download that breaks at load time. A wrong file raises :class:`IntegrityError` naming it.
With ``HF_HUB_OFFLINE=1`` the same call works from the cache, with the same checks.
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from anetts.artifacts import HF_SCHEME, file_sha256
from anetts.publish.layout import PUBLISH_MANIFEST
from anetts.runtime.errors import ArtifactError, IntegrityError
from anetts.runtime.manifest import contained_path

log = logging.getLogger(__name__)
_URI = re.compile("^" + re.escape(HF_SCHEME) + r"([A-Za-z0-9][\w.-]*)/([A-Za-z0-9][\w.-]*)(?:@([^@\s]+))?$")
LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/"
LEFTOVER_SUFFIXES = (".partial", ".incomplete", ".lock")


class HubFetchError(ArtifactError):
    """A Hub model that cannot be downloaded (unreachable endpoint, unknown repo or revision, bad address)."""


@dataclass(frozen=True)
class HubModel:
    repo_id: str
    commit: str  # the revision resolved to a commit sha
    snapshot: Path
    model_dir: Path
    variant: str

    @property
    def repo_cache(self) -> Path:
        """The cache's folder of this repo (``models--OWNER--NAME``): its snapshot files link into its ``blobs/``."""
        return repo_cache(self.snapshot)


def repo_cache(snapshot: Path) -> Path:
    return Path(snapshot).parents[1]  # <cache>/models--OWNER--NAME/snapshots/<commit>


def parse_uri(uri: str) -> tuple[str, str]:
    m = _URI.match(uri)
    if not m:
        raise HubFetchError(f"not a Hub model address: {uri!r} (expected hf://OWNER/REPO[@REVISION])")
    return f"{m.group(1)}/{m.group(2)}", m.group(3) or "main"


def variant_for_backend(backend: str | None) -> str:
    """The variant a backend needs: Core ML reads the packages only; torch and mil need the TorchScripts too."""
    from anetts.runtime.runners import default_executor

    return "coreml" if (backend or default_executor()) == "coreml" else "torch"


def _download_errors():
    import requests
    from huggingface_hub.utils import HfHubHTTPError, LocalEntryNotFoundError

    return (requests.exceptions.RequestException, HfHubHTTPError, LocalEntryNotFoundError, OSError)


class BadFileError(IntegrityError):
    """One downloaded file is wrong; ``path`` is its path in the repo."""

    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path = path


def verify_snapshot(snapshot: Path, layout: dict, variant: str) -> Path:
    """Check the variant's files in ``snapshot`` against the publish manifest; return the model dir."""
    return _verify(Path(snapshot), layout, variant)


def layout_paths(snapshot: Path, layout: dict) -> None:
    """Every path the publish manifest lists stays inside the snapshot, its links inside the repo's cache;
    else IntegrityError naming the entry (checked before anything is downloaded, opened or evicted)."""
    if not isinstance(layout, dict):
        raise IntegrityError(f"{PUBLISH_MANIFEST} is not a JSON object")
    entries = [(f"{PUBLISH_MANIFEST} model_dir", layout.get("model_dir"))]
    entries += [(f"{PUBLISH_MANIFEST} files[{i}].path", f.get("path") if isinstance(f, dict) else f)
                for i, f in enumerate(layout.get("files") or [])]
    for name, rels in (layout.get("variants") or {}).items():
        entries += [(f"{PUBLISH_MANIFEST} variants.{name}[{i}]", rel) for i, rel in enumerate(rels or [])]
    for what, rel in entries:
        contained_path(snapshot, rel, what, IntegrityError, resolves_inside=repo_cache(snapshot))


def _evict(snapshot: Path, rel: str) -> None:
    """Drop a bad file from the cache (its snapshot link and the blob behind it), so a retry downloads it.

    A commit's snapshot is otherwise trusted as immutable and never fetched again. ``rel`` is checked
    again here (inside the snapshot, its link inside the repo's cache): this removes files."""
    link = contained_path(snapshot, rel, f"{PUBLISH_MANIFEST} entry", IntegrityError, resolves_inside=repo_cache(snapshot))
    blob = link.resolve() if link.is_symlink() else None
    for p in (link, blob):
        if p is not None and (p.exists() or p.is_symlink()):
            p.unlink()


def _verify(snapshot: Path, layout: dict, variant: str) -> Path:
    layout_paths(snapshot, layout)
    variants = layout.get("variants") or {}
    if variant not in variants:
        raise HubFetchError(f"{PUBLISH_MANIFEST} has no variant {variant!r}; have {sorted(variants)}")
    files = {f["path"]: f for f in layout.get("files", [])}
    for rel in variants[variant]:
        entry = files.get(rel)
        if entry is None:
            raise BadFileError(rel, f"{rel} is in variant {variant} but not in {PUBLISH_MANIFEST}")
        path = snapshot / rel
        if not path.is_file():
            raise BadFileError(rel, f"{rel} is missing from the download ({snapshot})")
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(len(LFS_POINTER_PREFIX))
        if head == LFS_POINTER_PREFIX and entry["size"] > size:
            raise BadFileError(rel, f"{rel} is a Git-LFS pointer file, not its content ({size} bytes, "
                                 f"expected {entry['size']})")
        if size != entry["size"]:
            raise BadFileError(rel, f"{rel} has {size} bytes, the manifest says {entry['size']} (truncated or replaced)")
        got = file_sha256(path)
        if got != entry["sha256"]:
            raise BadFileError(rel, f"{rel} does not match {PUBLISH_MANIFEST}: sha256 {got[:12]}... != "
                                 f"{entry['sha256'][:12]}...; it was modified or corrupted")
    model_dir = snapshot / layout["model_dir"]
    for p in model_dir.rglob("*"):
        if p.name.endswith(LEFTOVER_SUFFIXES):
            raise IntegrityError(f"leftover of an interrupted transfer in the download: {p.relative_to(snapshot)}")
        if p.is_dir() and p.suffix == ".mlpackage" and not (p / "Manifest.json").is_file():
            raise IntegrityError(f"{p.relative_to(snapshot)} has no Manifest.json (incomplete package)")
    return model_dir


def fetch(uri: str, *, backend: str | None = None, variant: str | None = None, endpoint: str | None = None,
          cache_dir: str | Path | None = None, token: str | bool | None = None) -> HubModel:
    """Download (or reuse from the cache) and verify one variant of ``hf://OWNER/REPO@REVISION``."""
    from huggingface_hub import hf_hub_download, snapshot_download

    repo_id, revision = parse_uri(uri)
    variant = variant or variant_for_backend(backend)
    kw = {"repo_id": repo_id, "endpoint": endpoint, "cache_dir": cache_dir, "token": token}
    try:
        # the manifest first, at the revision; its directory name is the resolved commit sha
        manifest_path = Path(hf_hub_download(filename=PUBLISH_MANIFEST, revision=revision, **kw))
        commit = manifest_path.parent.name
        layout = json.loads(manifest_path.read_text(encoding="utf-8"))
        layout_paths(manifest_path.parent, layout)  # before snapshot_download is given its patterns
        patterns = list(layout.get("variants", {}).get(variant, [])) + [PUBLISH_MANIFEST, "README.md", "LICENSE*", "NOTICE*"]
        if variant not in layout.get("variants", {}):
            raise HubFetchError(f"{uri}: {PUBLISH_MANIFEST} has no variant {variant!r}; have {sorted(layout.get('variants', {}))}")
        # pinned to the commit the manifest came from, so a moving branch cannot mix two trees
        snapshot = Path(snapshot_download(revision=commit, allow_patterns=patterns, **kw))
    except _download_errors() as e:
        raise HubFetchError(f"cannot download {uri}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    except json.JSONDecodeError as e:
        raise IntegrityError(f"{uri}: {PUBLISH_MANIFEST} is not valid JSON ({e})") from e
    try:
        model_dir = verify_snapshot(snapshot, layout, variant)
    except BadFileError as e:
        _evict(snapshot, e.path)
        raise BadFileError(e.path, f"{uri}: {e}; removed from the cache (a retry downloads it again)") from None
    log.info("verified %s@%s (%s, %d files) in %s", repo_id, commit, variant, len(layout["variants"][variant]), snapshot)
    return HubModel(repo_id, commit, snapshot, model_dir, variant)
