"""Helpers of the publish tests (a module of its own: `from conftest import` is ambiguous, see workflow_helpers)."""
from __future__ import annotations

from pathlib import Path


def replace_file(path: Path, data: bytes | str) -> None:
    """Give ``path`` new contents under a new inode, so a hard-linked original stays as it was."""
    path = Path(path)
    path.unlink()
    if isinstance(data, str):
        path.write_text(data)
    else:
        path.write_bytes(data)
