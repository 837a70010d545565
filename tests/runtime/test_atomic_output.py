"""Files the CLI writes are complete or absent (issue 21, item 4).

`anetts speak -o` onto a nearly full filesystem wrote 0.68 s of a 4.10 s clip, exited 1 and left
the short file, destroying what was at that path before. Output now goes to a temporary file beside
the target, renamed over it once complete (`anetts.artifacts.atomic_file`). The disk runs full for
real: a tiny tmpfs where this test may mount one, and always a file-size limit (RLIMIT_FSIZE), which
fails the same write part way through without root.
"""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile as sf

from anetts.artifacts import atomic_file
from rt_common import SHORT

OLD = b"RIFF an older take the user kept\n" * 30  # 990 bytes


def speak(model_dir: Path, out: Path, fsize_limit: int | None = None) -> subprocess.CompletedProcess:
    def limit():  # in the child only: writes past the limit fail with EFBIG instead of killing it
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_limit, fsize_limit))

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-m", "anetts.cli", "speak", "--phonemes", SHORT, "--voice", "syn_a",
                           "--backend", "torch", "--model-dir", str(model_dir), "-o", str(out), "--no-progress"],
                          capture_output=True, text=True, env=env, timeout=300,
                          preexec_fn=limit if fsize_limit else None)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 48 KiB tmpfs (a wav of the short clip needs more); skipped where mounting is not permitted."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()}); the file-size-limit case covers it")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def _assert_old_file_kept(out: Path, proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"anetts speak: error: cannot write {out}" in proc.stderr and "Traceback" not in proc.stderr
    assert out.read_bytes() == OLD  # not truncated, not replaced by a short wav
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no temporary left behind


def test_speak_onto_a_full_tmpfs_keeps_the_old_file(model_dir, tiny_tmpfs):
    out = tiny_tmpfs / "o.wav"
    out.write_bytes(OLD)
    _assert_old_file_kept(out, speak(model_dir, out))


def test_speak_past_the_file_size_limit_keeps_the_old_file_then_replaces_it(model_dir, tmp_path):
    out = tmp_path / "o.wav"
    out.write_bytes(OLD)
    _assert_old_file_kept(out, speak(model_dir, out, fsize_limit=40_000))
    proc = speak(model_dir, out)  # room again: the whole clip replaces the old file
    assert proc.returncode == 0, proc.stderr
    audio, rate = sf.read(out)
    assert rate == 24000 and audio.size * 4 > 40_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.wav"]


def test_atomic_file_keeps_the_previous_file_on_any_failure(tmp_path):
    out = tmp_path / "sub" / "codes.npy"
    out.parent.mkdir()
    out.write_bytes(OLD)
    with pytest.raises(KeyboardInterrupt):
        with atomic_file(out) as tmp:
            assert tmp.parent == out.parent and tmp.suffix == ".npy" and tmp.name.startswith(".codes.npy.")
            tmp.write_bytes(b"half")
            raise KeyboardInterrupt
    assert out.read_bytes() == OLD and [p.name for p in out.parent.iterdir()] == ["codes.npy"]
    with atomic_file(out) as tmp:
        tmp.write_bytes(b"new")
    assert out.read_bytes() == b"new" and [p.name for p in out.parent.iterdir()] == ["codes.npy"]
    with pytest.raises(FileNotFoundError, match="did not produce"):  # a writer that wrote nothing
        with atomic_file(tmp_path / "none.wav"):
            pass
    assert not list(tmp_path.glob("*none*")) and not list(tmp_path.glob(".none*"))
