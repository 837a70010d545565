"""A warm process the build's jobs fork from, so that no job pays the imports of torch, coremltools
and the family's upstream package again (docs/startup.md; benchmarks/results/startup_log.md measures
what they cost each job).

The DAG is unchanged: every rule is still a `script:` job that Snakemake starts, times and reruns as
before. What changes is where its script runs:

- The build's main process starts one server (`start`, from the Snakefile's `onstart`). It binds its
  socket at once, imports `PRELOAD` and the family's modules, then accepts jobs. It never runs torch
  itself (a fork must not copy a running thread pool), and it exits when the build's process is gone.
- A job's first line of work, `_glue.setup`, calls `delegate`: the job's process (the client) sends
  its script path, argv, working directory, environment and standard streams (as file descriptors)
  to the server and waits. The server forks; the child takes the client's streams, directory and
  environment, drops the `anetts` modules it was forked with (so edits since the server started are
  read, as a cold job would) and runs the same script from its first line. There `_glue.setup` sees
  `CHILD_ENV` and goes on as in a cold job. The child sends back its exit status and its own CPU
  seconds and peak RSS; the client exits with that status.
- Without a server (none started, the socket is on another host under a cluster executor, or it
  died before taking the job) the job runs cold, in its own process, exactly as before.

Snakemake's `benchmark:` samples the client's process tree, which the child is not part of, so a
warm job's TSV has the right wall time but the client's CPU and RSS. The child's own figures go in
`artifacts.job_usage` (job_usage/, laid out as benchmarks/); readers of the TSV take CPU and RSS from there.
A job is tied to its client as a cold job is to Snakemake: if the client goes (Snakemake cancels the
job, or the build is killed), the child is interrupted and cleans up as a cold job would
(`anetts.recovery`); if the child goes, the client fails.
"""
from __future__ import annotations

import array
import importlib
import json
import os
import resource
import signal
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

from anetts.recovery import WATCH_INTERVAL_S, stop_when

SOCKET_ENV = "ANETTS_JOB_SERVER"  # the server's socket path, inherited by every job of the build
SOCKET_PREFIX = "anetts-jobs-"  # then the build's pid, a random part, ".sock"
CHILD_ENV = "ANETTS_JOB_SERVER_CHILD"  # set in a forked job: run here, do not delegate again
# imported once for all jobs: what most jobs import first (the script preamble's snakemake modules,
# numpy, torch); coremltools through anetts.imports (without its unused probes); families add theirs
PRELOAD = ("numpy", "torch", "snakemake.script", "snakemake.logging", "snakemake.iocontainers")
_HEADER = struct.Struct("!I")


class JobServerError(RuntimeError):
    pass


# -- the client (a job's own process) ----------------------------------------------------------------

def delegate(usage_path: Path | None) -> int | None:
    """Run this process's script in the build's server; its exit status, or None to run it here.

    `usage_path`: where the child's CPU seconds and peak RSS are written (removed first either way,
    so a cold rerun leaves no figures of an earlier warm run)."""
    if usage_path is not None:
        Path(usage_path).unlink(missing_ok=True)
    path = os.environ.get(SOCKET_ENV)
    if not path or os.environ.get(CHILD_ENV) or not os.path.exists(path):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        request = json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        fds = array.array("i", [0, 1, 2])
        sock.sendmsg([_HEADER.pack(len(request))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        sock.sendall(request)
        started = sock.recv(1)
    except OSError:
        started = b""
    if started != b"S":  # the server is gone (or never took the job): run cold
        sock.close()
        return None
    parent = os.getppid()
    stop_when(lambda: os.getppid() != parent, f"the build that started this job (pid {parent}) is gone")
    reply = _recv_all(sock)
    if not reply:
        print(f"anetts: the job server's process for this job ended without a result ({path})",
              file=sys.stderr, flush=True)
        return 1
    result = json.loads(reply)
    if usage_path is not None:
        Path(usage_path).parent.mkdir(parents=True, exist_ok=True)
        Path(usage_path).write_text(json.dumps(result["usage"]) + "\n", encoding="utf-8")
    return int(result["status"])


def _recv_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def read_usage(path: Path) -> dict | None:
    """A warm job's own figures ({"cpu_seconds", "max_rss_mb"}), or None for a cold job."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


# -- the server --------------------------------------------------------------------------------------

class BuildServer:
    """The server of one build, as the Snakefile's onstart / onsuccess / onerror drive it."""

    def __init__(self, enabled: bool, repo: Path, modules: list[str], log: Path):
        self.enabled, self.repo, self.modules, self.log = enabled, Path(repo), list(modules), Path(log)
        self.pid: int | None = None

    def start(self, local: bool) -> None:
        """`local`: the jobs run on this machine (a cluster executor's jobs could not reach the socket)."""
        if not (self.enabled and local) or SOCKET_ENV in os.environ:
            return
        try:
            path, self.pid = start(self.repo, self.modules, self.log)
        except JobServerError as e:
            print(f"anetts: {e}; every job runs in its own process", file=sys.stderr, flush=True)
            return
        os.environ[SOCKET_ENV] = path  # every job started from now on inherits it

    def stop(self) -> None:
        if self.pid is not None:
            stop(self.pid)
            os.environ.pop(SOCKET_ENV, None)
            self.pid = None


def start(repo: Path, modules: list[str], log: Path) -> tuple[str, int]:
    """Start a server for this process's build; (socket path, pid). Its jobs find it through
    `SOCKET_ENV`, which the caller sets in its environment so that every job inherits it."""
    import subprocess

    remove_stale_sockets(tempfile.gettempdir())
    path = os.path.join(tempfile.gettempdir(), f"{SOCKET_PREFIX}{os.getpid()}-{os.urandom(4).hex()}.sock")
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "anetts.jobserver", path, str(os.getpid()), *modules],
                                cwd=repo, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(repo)})
    deadline = time.monotonic() + 30.0
    while not os.path.exists(path):  # bound before any import: jobs queue on it from then on
        if proc.poll() is not None or time.monotonic() > deadline:
            raise JobServerError(f"the job server did not start (exit {proc.poll()}); its log: {log}")
        time.sleep(0.01)
    return path, proc.pid


def remove_stale_sockets(directory: str) -> list[Path]:
    """Remove the sockets of servers whose build is gone (a SIGKILL skips `serve`'s unlink); the
    build's pid is in each name. Returns what was removed."""
    removed = []
    for sock in Path(directory).glob(f"{SOCKET_PREFIX}*.sock"):
        try:
            os.kill(int(sock.name[len(SOCKET_PREFIX):].split("-")[0]), 0)
        except ProcessLookupError:
            sock.unlink(missing_ok=True)
            removed.append(sock)
        except (ValueError, OSError):  # not one of ours, or a live build of another user
            pass
    return removed


def stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def serve(path: str, build_pid: int, modules: list[str]) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        t0 = time.monotonic()
        _preload(modules)
        print(f"anetts job server: preloaded {len(sys.modules)} modules in {time.monotonic() - t0:.1f} s; "
              f"serving {path}", flush=True)
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps finished jobs
        listener.settimeout(WATCH_INTERVAL_S)
        while os.getppid() == build_pid:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            if os.fork() == 0:
                listener.close()
                _run_job(conn)  # never returns
            conn.close()
    finally:
        Path(path).unlink(missing_ok=True)


def _preload(modules: list[str]) -> None:
    from anetts import imports

    for name in PRELOAD:
        importlib.import_module(name)
    imports.coremltools()
    for name in modules:  # "package:submodule" imports a submodule without the package's __init__
        package, _, sub = name.partition(":")
        imports.submodules(package, sub) if sub else importlib.import_module(package)


def _run_job(conn: socket.socket) -> None:
    """In the forked child: become the client's job, run its script, send back the outcome."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the job's own subprocesses are waited for
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    status = 1
    try:
        header, fds, _, _ = conn.recvmsg(_HEADER.size, socket.CMSG_SPACE(3 * array.array("i").itemsize))
        streams = array.array("i")
        for level, kind, data in fds:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                streams.frombytes(data[: len(data) - len(data) % streams.itemsize])
        (size,) = _HEADER.unpack(header)
        request = b""
        while len(request) < size:
            request += conn.recv(size - len(request))
        job = json.loads(request)
        for target, fd in zip((0, 1, 2), streams):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        os.environ[CHILD_ENV] = "1"
        sys.argv = job["argv"]
        # this checkout's anetts as the job finds it on disk now, not as the server imported it
        for name in [m for m in sys.modules if m == "anetts" or m.startswith("anetts.")]:
            del sys.modules[name]
        conn.sendall(b"S")
        # the job's own (fresh) recovery module: the BUILD_GONE its code checks
        fresh = importlib.import_module("anetts.recovery")
        fresh.stop_when(lambda: not _peer_alive(conn), "the job's process is gone")
        status = _run_script(sys.argv[0])
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            conn.sendall(json.dumps({"status": status, "usage": own_usage()}).encode())
        finally:
            os._exit(status)


def _peer_alive(conn: socket.socket) -> bool:
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def _run_script(script: str) -> int:
    import atexit
    import runpy
    import traceback

    try:
        runpy.run_path(script, run_name="__main__")
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - a cold job's interpreter reports any exception, so does this
        traceback.print_exc()
        status = 1
    atexit._run_exitfuncs()  # the job's temporaries (anetts.recovery.guard_job) as at a cold exit
    return status


def own_usage() -> dict:
    """This process's CPU seconds and peak RSS, with its finished subprocesses' (as Snakemake's
    benchmark counts a job's process tree)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"cpu_seconds": round(me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime, 3),
            "max_rss_mb": round(max(me.ru_maxrss, kids.ru_maxrss) / 1024, 1)}  # ru_maxrss: KiB on Linux


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
