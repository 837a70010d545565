"""A build killed with `kill -9` recovers on the next `snakemake all`, with no flag or manual step.

What a killed build leaves, and who clears it:
- Snakemake's locks (`.snakemake/locks/`): the next build would stop with LockException. The main
  process of every Snakemake run holds a shared `flock` on `.snakemake/anetts/build.lock` for its
  lifetime; the kernel drops it when the process dies, however it dies. A run that can take it
  exclusively knows no other run of this directory is alive, and removes the locks left behind
  (then holds it shared like the others).
- Its running jobs: they are children of the killed process and would keep writing outputs the next
  build reruns. Each job watches its parent and stops (KeyboardInterrupt, so its temporaries are
  removed) when it is gone; and holds a shared `flock` on `jobs.lock`, which the next build takes
  exclusively before it starts anything: it waits for the last job of the killed build to end.
- Temporaries: the hidden `.<output>.<random>…` files and folders each step writes beside its
  outputs before renaming them (artifacts.is_temporary), and what coremltools and torch put in the
  temp dir, which jobs point at `.snakemake/anetts/tmp/` so the next build can remove it.
Incomplete outputs are rerun because profiles/default/config.yaml sets `rerun-incomplete`.
"""
from __future__ import annotations

import _thread
import fcntl
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from anetts.artifacts import ARTIFACTS, BUILD_GONE, is_temporary

log = logging.getLogger(__name__)

STATE_ENV = "ANETTS_BUILD_STATE"  # set by the build's main process, read by its jobs
STATE_DIR = Path(".snakemake") / "anetts"  # under the build's working directory
# how long a job whose build is gone gets to clean up after the interrupt, before it exits hard
# (the interrupt waits for the running C call of torch or coremltools to return)
JOB_GRACE_S = 10.0
WATCH_INTERVAL_S = 0.5

_held: list = []  # lock files kept open (and so locked) for the life of this process


def _say(message: str) -> None:
    print(f"anetts: {message}", file=sys.stderr, flush=True)


def _lock_file(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a+b")  # noqa: SIM115 - kept open on purpose: the open file holds the lock


def recover(workdir: Path = Path("."), *, job_wait_s: float = 60.0) -> bool:
    """Called by the main Snakemake process while it reads the Snakefile, before Snakemake locks.

    Returns False (and changes nothing) while another run of this directory is alive: then
    Snakemake's own lock refuses this one if it would write the same files, as before.
    """
    state = Path(workdir).resolve() / STATE_DIR
    snakemake_dir = state.parent
    alive = _lock_file(state / "build.lock")
    _held.append(alive)
    os.environ[STATE_ENV] = str(state)  # inherited by every job this run starts
    try:
        fcntl.flock(alive, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fcntl.flock(alive, fcntl.LOCK_SH)  # (waits while another run recovers)
        return False
    try:
        _clear_killed_build(snakemake_dir, state, Path(workdir), job_wait_s)
    finally:
        fcntl.flock(alive, fcntl.LOCK_SH)  # alive, like every other run, until this process ends
    return True


def _clear_killed_build(snakemake_dir: Path, state: Path, workdir: Path, job_wait_s: float) -> None:
    _await_jobs(state, job_wait_s)
    locks = snakemake_dir / "locks"
    if locks.is_dir() and any(locks.iterdir()):
        shutil.rmtree(locks)
        _say("removed Snakemake's locks left by a build that is no longer running")
    stale = _temporaries(workdir / ARTIFACTS)
    if (state / "tmp").is_dir():  # each job removes its own when it ends; these are the killed ones'
        stale += sorted((state / "tmp").iterdir())
    for p in stale:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    if stale:
        _say(f"removed {len(stale)} temporaries left by a killed build: "
             + ", ".join(str(p) for p in stale[:5]) + (" ..." if len(stale) > 5 else ""))


def _temporaries(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            if is_temporary(name):
                found.append(Path(dirpath) / name)
        dirnames[:] = [d for d in dirnames if not is_temporary(d)]  # removed whole
    return found


def _await_jobs(state: Path, wait_s: float) -> None:
    with _lock_file(state / "jobs.lock") as jobs:
        try:
            fcntl.flock(jobs, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say("waiting for the jobs of a killed build to stop")
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(jobs, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"jobs of a killed build still hold {state / 'jobs.lock'} after {wait_s:.0f} s; "
                            f"find them with `fuser {state / 'jobs.lock'}` and stop them") from None
                    time.sleep(0.2)
        fcntl.flock(jobs, fcntl.LOCK_UN)


def guard_job() -> None:
    """Called by every rule script at start: tie the job to the build that started it."""
    state = os.environ.get(STATE_ENV)
    if not state:  # not started by a build that recovers (a script run by hand)
        return
    state = Path(state)
    jobs = _lock_file(state / "jobs.lock")
    fcntl.flock(jobs, fcntl.LOCK_SH)
    _held.append(jobs)
    tmp = state / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    job_tmp = tempfile.mkdtemp(prefix=f"job-{os.getpid()}-", dir=tmp)
    tempfile.tempdir = job_tmp  # coremltools and torch write their temporary packages here
    os.environ["TMPDIR"] = job_tmp
    import atexit

    atexit.register(shutil.rmtree, job_tmp, ignore_errors=True)
    parent = os.getppid()
    stop_when(lambda: os.getppid() != parent, f"the build that started this job (pid {parent}) is gone")


def stop_when(gone, why: str) -> None:
    """Watch `gone()` in a thread; once it is true, stop this job: no output moved into place from then
    on, KeyboardInterrupt in the main thread (so temporaries are removed), a hard exit after the grace."""
    def watch():
        while not gone():
            time.sleep(WATCH_INTERVAL_S)
        log.error("%s; stopping", why)
        BUILD_GONE.set()
        _thread.interrupt_main()
        time.sleep(JOB_GRACE_S)
        os._exit(1)

    threading.Thread(target=watch, name="anetts-watch-build", daemon=True).start()
