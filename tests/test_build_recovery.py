"""A build killed with `kill -9` recovers on the next plain `snakemake` run (anetts.recovery):
no LockException, the killed build's job stops by itself, and its temporaries are removed."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from anetts.artifacts import is_temporary

from workflow_helpers import REPO, SNAKEMAKE, run_snakemake

MODEL = "kokoro-tiny"
PACKAGE = f"artifacts/{MODEL}/packages/generator/3s.mlpackage"


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def _temporaries(work: Path) -> list[Path]:
    # os.walk, not rglob: the running build renames and removes folders under it meanwhile
    return [Path(d) / n for d, dirs, files in os.walk(work / "artifacts") for n in (*dirs, *files) if is_temporary(n)]


def _job_temp_dirs(work: Path) -> list[Path]:
    tmp = work / ".snakemake" / "anetts" / "tmp"  # each job makes one when it starts (recovery.guard_job)
    return list(tmp.iterdir()) if tmp.is_dir() else []


def _start_and_kill(work: Path, until, kill_job_too: bool) -> list[int]:
    """Start `snakemake PACKAGE`; once `until(work)` finds something, kill -9 Snakemake (and every
    process of its job too if asked). Returns the pids of its children."""
    build = subprocess.Popen([*SNAKEMAKE, PACKAGE], cwd=work, env=dict(os.environ, PYTHONPATH=str(work)),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    while not until(work):
        assert build.poll() is None, f"the build ended before {until.__name__} found anything"
        assert time.monotonic() < deadline, f"{until.__name__} found nothing in 600 s"
        time.sleep(0.05)
    jobs = _children(build.pid)
    assert jobs
    if kill_job_too:
        # the whole process group at once: the script a job runs is a grandchild of Snakemake (under its
        # shell), and one left alive sees its parent gone and removes its temporaries before we look
        os.killpg(build.pid, signal.SIGKILL)
    else:
        os.kill(build.pid, signal.SIGKILL)
    build.wait()
    return jobs


def test_a_build_killed_with_kill_9_recovers_by_itself(built_workflow, tmp_path):
    work = tmp_path / "wf"
    shutil.copytree(built_workflow, work, symlinks=True)
    shutil.copytree(REPO / "profiles", work / "profiles")  # the README's build command reads profiles/default
    shutil.rmtree(work / PACKAGE)  # one convert job to do

    # kill -9 of Snakemake alone as its convert job starts: the job stops too, instead of converting
    # on in the background and writing the package (it took 20 s and did before)
    jobs = _start_and_kill(work, _job_temp_dirs, kill_job_too=False)
    assert any((work / ".snakemake" / "locks").iterdir())  # what made the next run stop before
    deadline = time.monotonic() + 30
    while any(_alive(j) for j in jobs):
        assert time.monotonic() < deadline, f"the killed build's jobs {jobs} still run after 30 s"
        time.sleep(0.2)
    assert not (work / PACKAGE).exists()

    # kill -9 of Snakemake and its job while it saves the package: its temporaries stay behind
    _start_and_kill(work, _temporaries, kill_job_too=True)
    left = _temporaries(work) + _job_temp_dirs(work)
    assert left

    proc = run_snakemake(work, PACKAGE)  # the plain command again: no --unlock, no flag
    assert "LockException" not in proc.stdout + proc.stderr
    assert "removed Snakemake's locks" in proc.stderr
    assert not [p for p in left if p.exists()] and not _temporaries(work)
    assert not list((work / ".snakemake" / "anetts" / "tmp").iterdir())  # each job removes its own
    assert (work / PACKAGE / "Manifest.json").is_file()


def test_a_job_whose_build_is_gone_moves_no_output_into_place(tmp_path):
    """The watcher sets BUILD_GONE before it interrupts the job; a library may swallow that interrupt
    (a bare `except:`), so the step's outputs are refused at the rename too, temporaries removed."""
    from anetts.artifacts import BUILD_GONE, atomic_outputs

    final = tmp_path / "3s.json"
    BUILD_GONE.set()
    try:
        try:
            with atomic_outputs(final) as (tmp,):
                tmp.write_text("{}")
        except RuntimeError as e:
            assert "the build that started this job is gone; 3s.json is not kept" in str(e)
        else:
            raise AssertionError("atomic_outputs kept an output after its build was gone")
    finally:
        BUILD_GONE.clear()
    assert list(tmp_path.iterdir()) == []
    with atomic_outputs(final) as (tmp,):  # and a job whose build lives writes as before
        tmp.write_text("{}")
    assert final.read_text() == "{}"
