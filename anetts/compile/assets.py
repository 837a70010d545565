"""The runtime assets step: the family writes its files into a fresh directory, swapped in whole."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from anetts.artifacts import clear_outputs
from anetts.families import get_family


def write_assets(family_name: str, weights_dir: Path, out_dir: Path) -> list[str]:
    family = get_family(family_name)
    out_dir = Path(out_dir)
    clear_outputs(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        written = family.write_runtime_assets(Path(weights_dir), tmp) if family.write_runtime_assets else []
        tmp.replace(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return written
