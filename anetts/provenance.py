"""The provenance block every JSON artifact carries: code, tools and machine."""
from __future__ import annotations

import functools
import os
import platform
import subprocess
from importlib import metadata

from anetts._version import __version__

TOOLS = ("torch", "coremltools", "numpy", "kokoro", "transformers", "snakemake")


@functools.lru_cache(maxsize=None)
def version_of(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def tool_versions(extra: tuple[str, ...] = ()) -> dict[str, str]:
    return {"anetts": __version__, **{name: version_of(name) for name in (*TOOLS, *extra)}}


@functools.lru_cache(maxsize=1)
def _git() -> dict:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                                    capture_output=True, text=True, check=True).stdout.strip())
        return {"commit": commit, "dirty": dirty}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}


def machine() -> dict:
    return {
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }


def provenance() -> dict:
    return {"git": _git(), "versions": tool_versions(), "machine": machine()}
