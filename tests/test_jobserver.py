"""The build's job server (anetts/jobserver.py): jobs forked from one warm process run as they would
in their own, report their own usage, and are stopped with their client; without a server, cold."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from anetts import artifacts, jobserver
from workflow_helpers import REPO, make_workflow_copy, run_snakemake, small_config

# A job as `_glue.setup` makes one: delegate first; in the server's child (or cold) do the work.
CLIENT = """\
import os, sys, time
sys.path.insert(0, {repo!r})
from anetts import jobserver
status = jobserver.delegate({usage!r})
if status is not None:
    sys.stdout.flush()
    os._exit(status)
import anetts.imports
where = "warm" if os.environ.get(jobserver.CHILD_ENV) else "cold"
print(where, os.getcwd(), os.environ.get("JOB_MARK"), getattr(anetts.imports, "EDITED", None), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if os.environ.get("JOB_SLEEP"):
    open(os.environ["JOB_SLEEP"], "w").write(str(os.getpid()))
    time.sleep(60)
sys.exit(int(os.environ.get("JOB_EXIT", "0")))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server on a copy of the package (the tests edit it), as a build's onstart starts one."""
    root = tmp_path_factory.mktemp("js")
    shutil.copytree(REPO / "anetts", root / "anetts", ignore=shutil.ignore_patterns("__pycache__"))
    path, pid = jobserver.start(root, [], root / "server.log")
    yield root, path, pid
    jobserver.stop(pid)


def run_client(root: Path, path: str | None, tmp_path: Path, **env) -> subprocess.Popen:
    script = tmp_path / "job.py"
    script.write_text(CLIENT.format(repo=str(root), usage=str(tmp_path / "job.usage.json")))
    e = {k: v for k, v in os.environ.items() if k != jobserver.SOCKET_ENV}
    if path:
        e[jobserver.SOCKET_ENV] = path
    return subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env={**e, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_job_runs_in_the_server_with_its_own_directory_environment_streams_and_status(server, tmp_path):
    root, path, _ = server
    proc = run_client(root, path, tmp_path, JOB_MARK="m1", JOB_EXIT="3")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    assert out.split() == ["warm", str(tmp_path), "m1", "None"] and "to stderr" in err
    usage = json.loads((tmp_path / "job.usage.json").read_text())
    assert usage["cpu_seconds"] > 0 and usage["max_rss_mb"] > 100  # the child's own process: torch is mapped


def test_edits_made_after_the_server_started_are_what_a_job_runs(server, tmp_path):
    root, path, _ = server
    imports_py = root / "anetts" / "imports.py"  # the server imported it before forking
    original = imports_py.read_text()
    imports_py.write_text(original + "\nEDITED = 'yes'\n")
    try:
        proc = run_client(root, path, tmp_path)
        out, err = proc.communicate(timeout=120)
    finally:
        imports_py.write_text(original)
    assert proc.returncode == 0, err
    assert out.split()[0] == "warm" and out.split()[-1] == "yes"


def test_a_killed_client_stops_its_job(server, tmp_path):
    root, path, _ = server
    pid_file = tmp_path / "child.pid"
    proc = run_client(root, path, tmp_path, JOB_SLEEP=str(pid_file))
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert child != proc.pid
    proc.kill()  # as Snakemake cancels a job
    proc.wait()
    deadline = time.monotonic() + 15
    while _alive(child):
        assert time.monotonic() < deadline, f"the job's child {child} outlived its killed client"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_without_a_server_the_job_runs_cold(server, tmp_path):
    root, _, _ = server
    out, err = run_client(root, None, tmp_path).communicate(timeout=120)
    assert out.split()[0] == "cold", err
    out, err = run_client(root, str(tmp_path / "gone.sock"), tmp_path).communicate(timeout=120)
    assert out.split()[0] == "cold", err
    assert not (tmp_path / "job.usage.json").exists()


def test_a_server_that_fails_to_start_leaves_its_jobs_cold(tmp_path):
    path, pid = jobserver.start(REPO, ["no_such_module_of_anetts"], tmp_path / "server.log")
    out, err = run_client(REPO, path, tmp_path).communicate(timeout=120)
    assert out.split()[0] == "cold", err
    deadline = time.monotonic() + 60
    while os.path.exists(path):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert "no_such_module_of_anetts" in (tmp_path / "server.log").read_text()
    os.waitpid(pid, 0)


def test_sockets_of_builds_that_are_gone_are_removed(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"{jobserver.SOCKET_PREFIX}{gone.pid}-0a1b2c3d.sock"
    live = tmp_path / f"{jobserver.SOCKET_PREFIX}{os.getpid()}-0a1b2c3d.sock"
    other = tmp_path / f"{jobserver.SOCKET_PREFIX}x-y.sock"
    for p in (dead, live, other):
        p.touch()
    assert jobserver.remove_stale_sockets(str(tmp_path)) == [dead]
    assert not dead.exists() and live.exists() and other.exists()


def test_a_warm_build_writes_what_a_cold_one_writes(tmp_path, tiny_weights):
    """The same jobs with and without the server: the same bytes; only the warm one has usage files,
    and benchmarks/resources_from_benchmarks.py refuses them (they are not a cold job's figures)."""
    targets = ["artifacts/kokoro-tiny/export/duration/t32.scenario.npz", "artifacts/kokoro-tiny/packages/duration/t32.mlpackage"]
    built = {}
    for mode in ("True", "False"):
        wd = make_workflow_copy(tmp_path / mode, small_config(tiny_weights))
        proc = run_snakemake(wd, *targets, "--config", f"job_server={mode}")
        built[mode] = wd
        usage = sorted(p.as_posix() for p in (wd / "artifacts").rglob("job_usage/**/*.json"))
        if mode == "True":
            assert "serving" in (wd / ".snakemake" / "anetts" / "job-server.log").read_text()
            assert usage == sorted((wd / artifacts.job_usage(artifacts.job_benchmark("kokoro-tiny", r, *w))).as_posix()
                                   for r, w in (("weights", ()), ("export", ("duration", "t32")),
                                                ("convert", ("duration", "t32"))))
        else:
            assert usage == [] and not (wd / ".snakemake" / "anetts" / "job-server.log").exists(), proc.stderr
    for t in targets:
        assert artifacts.tree_sha256(built["True"] / t) == artifacts.tree_sha256(built["False"] / t), t
    refused = subprocess.run([sys.executable, str(REPO / "benchmarks" / "resources_from_benchmarks.py"), "--workdir",
                              str(built["True"]), "--model", "kokoro-tiny", "--allow-missing", "-o", str(tmp_path / "t.json")],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "job_server=False" in refused.stderr
