"""One loader, four sources, one on-disk layout: synthetic, Hugging Face, a local directory, or an
ONNX export converted back to the upstream layout.

`materialize_weights` fills `out_dir` with the family's upstream-format files, validates them
(naming any missing, extra, mis-shaped or non-finite tensor) and writes `source.json` with the
provenance and sha256 of every file. The directory only appears once everything succeeded.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from anetts.artifacts import tree_sha256, write_json
from anetts.families import get_family

log = logging.getLogger(__name__)

SOURCE_KINDS = ("synthetic", "hf", "local", "onnx")


class WeightsSourceError(RuntimeError):
    pass


def _fetch_hf(repo_id: str, revision: str, filenames: list[str], dest: Path) -> None:
    """Download `filenames` at a pinned revision through huggingface_hub's cache."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    for name in filenames:
        try:
            path = hf_hub_download(repo_id=repo_id, filename=name, revision=revision)
        except LocalEntryNotFoundError as e:
            raise WeightsSourceError(
                f"cannot fetch {name} of {repo_id}@{revision}: not in the local Hugging Face cache and the hub "
                f"is unreachable (offline or HF_HUB_OFFLINE=1). Use a `local` source or the synthetic default. "
                f"Cause: {e}") from e
        except Exception as e:  # network errors, 404 for a wrong revision or file name
            raise WeightsSourceError(f"cannot fetch {name} of {repo_id}@{revision}: {type(e).__name__}: {e}") from e
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


def _copy_local(src: Path, filenames: list[str], dest: Path) -> None:
    src = Path(src)
    if not src.is_dir():
        raise WeightsSourceError(f"local weights directory does not exist: {src}")
    for name in filenames:
        if not (src / name).is_file():
            raise WeightsSourceError(f"missing weight file: {src / name}")
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / name, dest / name)


def materialize_weights(family_name: str, source: dict, out_dir: Path) -> dict:
    """Create `out_dir` from `source` (a validated config block); returns the source record."""
    family = get_family(family_name)
    kind = source.get("source")
    if kind not in SOURCE_KINDS:
        raise WeightsSourceError(f"weights.source must be one of {SOURCE_KINDS}, got {kind!r}")
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        staging = work / "weights"
        staging.mkdir()
        record = {"family": family_name, **source}
        if kind == "hf":
            revision = str(source.get("revision", ""))
            if len(revision) != 40 or any(c not in "0123456789abcdef" for c in revision):
                raise WeightsSourceError(f"weights.revision: hf sources need a pinned 40-hex commit revision, "
                                         f"got {revision!r}")
        if kind == "synthetic":
            record["synthesis"] = family.synthesize(staging, source["preset"], int(source.get("seed", 0)), work)
            voices = family.voices.synthetic if family.voices else ()
        elif kind == "onnx":
            if family.convert_onnx is None:
                raise WeightsSourceError(f"family {family_name!r} has no ONNX weights converter")
            voices = list(source["voices"])
            record["conversion"] = family.convert_onnx(source, staging, voices, work)
        else:
            voices = list(source.get("voices") or (family.voices.defaults if family.voices else ()))
            if voices and family.voices is None:
                raise WeightsSourceError(f"weights.voices: family {family_name!r} has no voice packs "
                                         f"(config names {voices})")
            files = family.weights_files + tuple(family.voices.file(v) for v in voices)
            if kind == "hf":
                def fetch(names):
                    _fetch_hf(source["repo_id"], source["revision"], list(names), staging)
            else:
                def fetch(names):
                    _copy_local(Path(os.path.expanduser(source["path"])), list(names), staging)
            fetch(files)
            if family.gather_weights is not None:  # files named by the ones just fetched (shards)
                family.gather_weights(fetch, staging)
        family.validate_weights(staging, list(voices), work)
        record["voices"] = list(voices)
        record["files"] = {p.relative_to(staging).as_posix(): tree_sha256(p)
                           for p in sorted(staging.rglob("*")) if p.is_file()}
        write_json(staging / "source.json", record)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
        return record
    finally:
        shutil.rmtree(work, ignore_errors=True)
