"""Two servers on 127.0.0.1 sharing one directory of git repos: olah (a real Hub mirror, read side,
offline) and hub_server.py (the Hub's commit protocol, write side). What one commits, olah serves."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TOKEN = "hf_test_token"


def olah_cli() -> Path:
    """olah lives in its own venv (the Makefile's OLAH_VENV): it needs huggingface_hub 2.x, the project 0.x."""
    path = Path(os.environ.get("ANETTS_OLAH_CLI", REPO / ".venv-olah" / "bin" / "olah-cli"))
    if not path.is_file():
        raise RuntimeError(f"olah is not installed at {path}: run `make olah` (or set ANETTS_OLAH_CLI)")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}")
        try:
            requests.get(url, timeout=2)
            return
        except requests.exceptions.ConnectionError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} did not answer at {url} within {timeout:.0f} s")


@dataclass
class Hub:
    write: str  # hub_server.py: HF_ENDPOINT for publishing
    read: str  # olah: HF_ENDPOINT for loading
    mirrors: Path
    token: str = TOKEN

    def repo(self, repo_id: str) -> Path:
        return self.mirrors / "models" / repo_id

    def git(self, repo_id: str, *args: str) -> str:
        return subprocess.run(["git", "-C", str(self.repo(repo_id)), *args], capture_output=True, text=True,
                              check=True).stdout.strip()

    def head(self, repo_id: str) -> str | None:
        p = subprocess.run(["git", "-C", str(self.repo(repo_id)), "rev-parse", "-q", "--verify", "main"],
                           capture_output=True, text=True)
        return p.stdout.strip() or None

    def fail_next_commits(self, n: int) -> None:
        requests.post(f"{self.write}/_control", json={"fail_commit": n}, timeout=10).raise_for_status()

    def env(self, endpoint: str, **extra) -> dict:
        env = dict(os.environ, PYTHONPATH=str(REPO), HF_ENDPOINT=endpoint, HF_TOKEN=self.token,
                   HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
        env.update(extra)
        return env


@pytest.fixture(scope="session")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    mirrors = root / "mirrors"
    (mirrors / "models").mkdir(parents=True)
    olah_port, dead_port = _free_port(), _free_port()
    # offline mirror: upstream is a closed loopback port, so nothing can leave the machine
    (root / "olah.toml").write_text(f"""[basic]
host = "127.0.0.1"
port = {olah_port}
repos-path = "{root / 'olah-cache'}"
hf-scheme = "http"
hf-netloc = "127.0.0.1:{dead_port}"
hf-lfs-netloc = "127.0.0.1:{dead_port}"
mirror-scheme = "http"
mirror-netloc = "127.0.0.1:{olah_port}"
mirror-lfs-netloc = "127.0.0.1:{olah_port}"
mirrors-path = ["{mirrors}"]
[accessibility]
offline = true
""")
    procs = []
    try:
        hub_proc = subprocess.Popen([sys.executable, str(HERE / "hub_server.py"), "--mirrors", str(mirrors), "--port", "0",
                                     "--token", TOKEN], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(hub_proc)
        line = hub_proc.stdout.readline()
        if not line.startswith("READY"):
            raise RuntimeError(f"hub_server.py did not start: {line}{hub_proc.stdout.read()}")
        write = f"http://127.0.0.1:{int(line.split()[1])}"
        olah_proc = subprocess.Popen([str(olah_cli()), "-c", str(root / "olah.toml")], cwd=root,
                                     stdout=open(root / "olah.log", "w"), stderr=subprocess.STDOUT)
        procs.append(olah_proc)
        read = f"http://127.0.0.1:{olah_port}"
        _wait(f"{read}/api/models/none/none/revision/main", olah_proc, "olah")
        yield Hub(write=write, read=read, mirrors=mirrors)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture(scope="session")
def built_model(built_workflow) -> Path:
    """The session's kokoro-tiny build (read-only here: destructive tests copy it)."""
    return Path(built_workflow) / "artifacts" / "kokoro-tiny"


@pytest.fixture
def model_copy(built_model, tmp_path) -> Path:
    """A private copy of the build to break. Its files are hard links (the tree is ~0.5 GB): change
    one only through publish_helpers.replace_file, which gives it a new inode and leaves the build intact."""
    dst = tmp_path / "kokoro-tiny"
    shutil.copytree(built_model, dst, ignore=shutil.ignore_patterns("publish"), copy_function=os.link)
    return dst

