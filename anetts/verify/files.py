"""Re-check every file a manifest lists against its recorded sha256, and make bad ones rebuild.

Snakemake decides what to rerun from timestamps and params, so a package corrupted on disk
(one byte of weight.bin changed) looks up to date. `anetts verify --repair` removes each file
that no longer matches, and the manifest with it: the next `snakemake all` rebuilds exactly those
outputs and what depends on them, and the runtime can never load the stale manifest meanwhile.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from anetts.artifacts import clear_outputs, tree_sha256
from anetts.runtime.manifest import manifest_paths


class VerifyError(RuntimeError):
    pass


@dataclass(frozen=True)
class Checked:
    path: Path  # the file or package directory
    expected: str
    actual: str | None  # None: missing

    @property
    def ok(self) -> bool:
        return self.actual == self.expected

    def describe(self) -> str:
        if self.actual is None:
            return f"{self.path}: missing"
        return f"{self.path}: sha256 {self.actual[:12]}... != manifest {self.expected[:12]}..."


def manifested_files(model_dir: Path) -> list[tuple[Path, str]]:
    """(path, sha256) of every file the manifest records a digest for."""
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
    # before anything listed is hashed or removed: --repair must never reach outside the model dir
    manifest_paths(model_dir, manifest, str(manifest_file), VerifyError)
    out = []
    for entry in (*manifest.get("packages", []), *manifest.get("bundles", [])):
        out.append((model_dir / entry["path"], entry["sha256"]))
        if entry.get("torchscript_sha256"):
            out.append((model_dir / entry["torchscript"], entry["torchscript_sha256"]))
    for asset in manifest.get("assets", []):
        out.append((model_dir / asset["path"], asset["sha256"]))
    return out


def verify_model_dir(model_dir: Path) -> list[Checked]:
    return [Checked(path, sha, tree_sha256(path) if path.exists() else None)
            for path, sha in manifested_files(model_dir)]


def repair(model_dir: Path, bad: list[Checked]) -> list[Path]:
    """Remove the bad files and the manifest, so the build reruns them; returns what was removed."""
    removed = [c.path for c in bad if c.path.exists()]
    if bad:
        removed.append(Path(model_dir) / "manifest.json")
        clear_outputs(*removed)
    return removed


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="anetts verify", description=__doc__.splitlines()[0])
    p.add_argument("model_dir", help="a built model directory, e.g. artifacts/kokoro-tiny")
    p.add_argument("--repair", action="store_true",
                   help="remove files that do not match (and the manifest) so `snakemake all` rebuilds them")
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
        for path in repair(Path(args.model_dir), bad):
            print(f"removed {path}")
        print("run `snakemake all` to rebuild them")
    return 1 if bad else 0
