"""Re-check every file a manifest lists against its recorded sha256, and make bad ones rebuild.

Snakemake decides what to rerun from timestamps and params, so a package corrupted on disk
(one byte of weight.bin changed) looks up to date. `anetts verify --repair` removes each file
that no longer matches, and the manifest with it: the next `snakemake all` rebuilds exactly those
outputs and what depends on them, and the runtime can never load the stale manifest meanwhile.
A file that is part of a larger build output (an asset inside the `runtime_assets` directory)
takes that whole output with it: Snakemake does not rerun a directory output that still exists.
"""
from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path

from anetts.artifacts import clear_outputs, tree_sha256
from anetts.runtime.manifest import manifest_paths
from anetts.runtime.manifest import unreadable_version


class VerifyError(RuntimeError):
    pass


@dataclass(frozen=True)
class Checked:
    path: Path  # the file or package directory
    expected: str
    actual: str | None  # None: missing
    output: Path  # the build output it is part of: `path` itself, or a directory output holding it

    @property
    def ok(self) -> bool:
        return self.actual == self.expected

    def describe(self) -> str:
        if self.actual is None:
            return f"{self.path}: missing"
        return f"{self.path}: sha256 {self.actual[:12]}... != manifest {self.expected[:12]}..."


def manifested_files(model_dir: Path) -> list[tuple[Path, str, Path]]:
    """(path, sha256, build output holding it) of every file the manifest records a digest for."""
    model_dir = Path(model_dir)
    manifest_file = model_dir / "manifest.json"
    if not manifest_file.is_file():
        raise VerifyError(f"{manifest_file}: no manifest; build the model first (snakemake all)")
    try:
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise VerifyError(f"{manifest_file}: not valid JSON ({e}); delete it and rebuild") from e
    if not isinstance(manifest, dict):
        raise VerifyError(f"{manifest_file}: not a manifest (expected a JSON object); delete it and rebuild")
    if (why := unreadable_version(manifest)) is not None:
        raise VerifyError(f"{manifest_file}: {why}")
    # before anything listed is hashed or removed: --repair must never reach outside the model dir
    manifest_paths(model_dir, manifest, str(manifest_file), VerifyError)
    out = []
    for entry in (*manifest.get("packages", []), *manifest.get("bundles", [])):
        out.append((model_dir / entry["path"], entry["sha256"], model_dir / entry["path"]))
        if entry.get("torchscript_sha256"):
            out.append((model_dir / entry["torchscript"], entry["torchscript_sha256"], model_dir / entry["torchscript"]))
    for asset in manifest.get("assets", []):
        # manifests before "output" was recorded: the assets sat in one directory output, the parent
        # of their names' first component
        output = asset.get("output") or _asset_output(asset)
        if not _holds(output, asset["path"]):  # repair removes it: never more than the asset's own output
            raise VerifyError(f"{manifest_file}: asset {asset['path']!r} has output {output!r}, which is not a "
                              f"folder inside the model directory holding it")
        out.append((model_dir / asset["path"], asset["sha256"], model_dir / output))
    return out


def _holds(output: str, path: str) -> bool:
    out, inner = os.path.normpath(output), os.path.normpath(path)
    return (not os.path.isabs(out) and out not in (".", "..") and not out.startswith("../")
            and inner.startswith(out + "/"))


def _asset_output(asset: dict) -> str:
    depth = len(Path(asset["name"]).parts)
    return Path(asset["path"]).parents[depth - 1].as_posix()


def verify_model_dir(model_dir: Path) -> list[Checked]:
    return [Checked(path, sha, tree_sha256(path) if path.exists() else None, output)
            for path, sha, output in manifested_files(model_dir)]


def repair(model_dir: Path, bad: list[Checked]) -> list[Path]:
    """Remove the build outputs holding bad files, and the manifest, so the build reruns them;
    returns what was removed."""
    if not bad:
        return []
    # the manifest first: whatever happens after, the runtime cannot load it with a bad file
    removed = [Path(model_dir) / "manifest.json", *dict.fromkeys(c.output for c in bad if c.output.exists())]
    for path in removed:  # check every removal can happen before making any: nothing half-repaired
        for d in _dirs_written_by_removing(path):
            if not os.access(d, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "not writable, so nothing was removed", str(d))
    clear_outputs(*removed)
    return removed


def _dirs_written_by_removing(path: Path):
    yield path.parent
    if path.is_dir() and not path.is_symlink():
        yield path
        yield from (p for p in path.rglob("*") if p.is_dir() and not p.is_symlink())


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="anetts verify", description=__doc__.splitlines()[0])
    p.add_argument("model_dir", help="a built model directory, e.g. artifacts/kokoro-tiny")
    p.add_argument("--repair", action="store_true",
                   help="remove the build outputs holding files that do not match (and the manifest) so "
                        "`snakemake all` rebuilds them")
    args = p.parse_args(argv)
    try:
        checked = verify_model_dir(Path(args.model_dir))
    except VerifyError as e:
        print(f"anetts verify: error: {e}", file=sys.stderr)
        return 2
    bad = [c for c in checked if not c.ok]
    for c in bad:
        print(f"BAD  {c.describe()}", file=sys.stderr)
    print(f"{len(checked) - len(bad)}/{len(checked)} manifested files match their sha256")
    if bad and args.repair:
        try:
            removed = repair(Path(args.model_dir), bad)
        except OSError as e:  # a read-only model directory, a file owned by someone else
            print(f"anetts verify: error: cannot repair {args.model_dir}: {e.strerror}: {e.filename}", file=sys.stderr)
            return 2
        for path in removed:
            print(f"removed {path}")
        print("run `snakemake all` to rebuild them")
    return 1 if bad else 0
