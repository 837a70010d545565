"""The Snakemake workflow catalog's checks: `snakemake --lint` and `snakefmt --check` find nothing,
and envs/anetts.yaml (every rule's `conda:` environment) pins what `make setup` installs."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from workflow_helpers import REPO, SNAKEMAKE

SNAKEFMT = Path(sys.executable).with_name("snakefmt")


def test_snakemake_lint_finds_nothing():
    proc = subprocess.run([*SNAKEMAKE, "--lint"], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Lints for" not in out, out[-6000:]
    assert "Congratulations, your workflow is in a good condition!" in out


def test_snakefmt_check_is_clean():
    exe = str(SNAKEFMT) if SNAKEFMT.exists() else shutil.which("snakefmt")
    assert exe, "snakefmt is not installed (pip install -e '.[test]')"
    proc = subprocess.run([exe, "--check", "Snakefile", "rules/"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, f"run `snakefmt Snakefile rules/`:\n{proc.stderr[-4000:]}"


def _name(req: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower().replace("_", "-")


def _makefile_spec(var: str) -> str:
    return re.search(rf"^{var} \?= (.+)$", (REPO / "Makefile").read_text(), re.M).group(1).strip()


def test_conda_env_pins_what_make_setup_installs():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["coreai"]]
    env = yaml.safe_load((REPO / "envs" / "anetts.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    norm = lambda reqs: {_name(r): r.replace(" ", "") for r in reqs}
    want, got = norm(wanted), norm(pip)
    # torch: the Makefile's pin, not pyproject's lower bound
    want["torch"] = _makefile_spec("TORCH_SPEC")
    assert got == want
    post = (REPO / "envs" / "anetts.post-deploy.sh").read_text()
    for var in ("FISH_SPEECH_SPEC", "DAC_SPEC", "MLX_AUDIO_SPEC"):
        assert f'"{_makefile_spec(var)}"' in post and "--no-deps" in post, var
    assert os.access(REPO / "envs" / "anetts.post-deploy.sh", os.X_OK)
    rules = "".join(p.read_text() for p in sorted((REPO / "rules").glob("*.smk")))
    assert rules.count('    conda:\n        "../envs/anetts.yaml"\n') == rules.count("\n    script:\n")
