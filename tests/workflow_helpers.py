"""Workflow-copy helpers shared by conftest.py and test modules.

A module of its own (not conftest) because `from conftest import ...` resolves to whichever
conftest.py pytest imported last (tests/runtime/ has one too).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
WORKFLOW_FILES = ("Snakefile", "rules", "schemas", "workflow_scripts", "envs", "anetts")
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def cluster_python() -> str:
    """The interpreter of the venv holding the slurm / kubernetes / s3 plugins (`make cluster`), which
    are kept out of the project venv because Snakemake imports every installed plugin at start."""
    path = Path(os.environ.get("ANETTS_CLUSTER_PYTHON", REPO / ".venv-cluster" / "bin" / "python"))
    if not path.is_file():
        raise RuntimeError(f"the cluster plugins' venv is not at {path}: run `make cluster` (or set ANETTS_CLUSTER_PYTHON)")
    return str(path)


def small_config(weights_dir: Path | None = None, **stage_buckets) -> dict:
    """The repo config cut to kokoro-tiny with one small bucket per stage."""
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    buckets = {"duration": [32], "f0ntrain": [3], "decoder_pre": [3], "generator": [3], **stage_buckets}
    for stage, sizes in buckets.items():
        cfg["families"]["kokoro"]["stages"][stage]["buckets"] = sizes
    if weights_dir is not None:  # reuse the session's weights instead of synthesizing again
        cfg["models"]["kokoro-tiny"]["weights"] = {"source": "local", "path": str(weights_dir), "voices": ["syn_a", "syn_b"]}
    return cfg


def make_workflow_copy(dest: Path, config: dict) -> Path:
    """A self-contained copy of the workflow (incl. the anetts package) that tests may edit."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    (dest / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


def commit_copy(workdir: Path) -> str:
    """Make a workflow copy a git checkout of itself (one commit) so its build records a real commit
    in its provenance; returns that commit."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(workdir), "-c", "user.name=test", "-c", "user.email=test@localhost",
                               *args], check=True, capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "workflow copy")
    return git("rev-parse", "HEAD")


def run_snakemake(workdir: Path, *args: str, check: bool = True, python: str = sys.executable) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(workdir))
    proc = subprocess.run([python, "-m", "snakemake", "--cores", "2", *args], cwd=workdir, env=env, capture_output=True,
                          text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc
