"""Runtime fixtures on the session's kokoro-tiny build (one bucket per stage: t32, 3 s)."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_dir(built_workflow) -> Path:
    return Path(built_workflow) / "artifacts" / "kokoro-tiny"


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One torch thread while the runtime tests run, restored afterwards for other tests.

    On a shared, loaded CPU, OpenMP threads that wait for a preempted peer make small ops (the
    LSTMs) 10-50x slower; a single thread is fast and steady.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tts(model_dir):
    from anetts.loader import load

    return load(model_dir, backend="torch")


@pytest.fixture(scope="session")
def kmodel(model_dir):
    from anetts.models.kokoro.weights import load_kmodel

    return load_kmodel(model_dir / "weights")

