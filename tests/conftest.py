"""Shared fixtures: tiny synthetic weights and one small end-to-end workflow build."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from workflow_helpers import commit_copy, make_workflow_copy, run_snakemake, small_config


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory) -> Path:
    """Synthetic kokoro-tiny weights, materialized once per session."""
    from anetts.weights import materialize_weights

    out = tmp_path_factory.mktemp("weights") / "weights"
    materialize_weights("kokoro", {"source": "synthetic", "preset": "kokoro-tiny", "seed": 0}, out)
    return out


@pytest.fixture(scope="module")
def module_tmp(request, tmp_path_factory) -> Path:
    """A directory for one test module's shared build, removed after the module unless one of its tests
    failed: a module's build copy is up to 1.2 GB, and a whole run would otherwise keep them all."""
    failed_before = request.session.testsfailed
    path = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    yield path
    if request.session.testsfailed == failed_before:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_model(tiny_weights):
    from anetts.families import get_family

    return get_family("kokoro").load_reference_model(tiny_weights)


@pytest.fixture(scope="session")
def built_workflow(tmp_path_factory, tiny_weights) -> Path:
    """kokoro-tiny built end to end by `snakemake all` (one bucket per stage)."""
    workdir = make_workflow_copy(tmp_path_factory.mktemp("wf"), small_config(tiny_weights))
    commit_copy(workdir)  # so the build's provenance names a commit the report tests can check
    run_snakemake(workdir, "all")
    return workdir


@pytest.fixture
def hf_offline(monkeypatch):
    """huggingface_hub in offline mode for one test. Its HTTP session is cached per thread and built
    from the offline flag, so the session is reset on the way in and out: otherwise every later test
    in the process (the publish tests' loopback Hub) would stay offline."""
    import huggingface_hub.constants as C
    from huggingface_hub.utils import reset_sessions

    monkeypatch.setattr(C, "HF_HUB_OFFLINE", True)
    reset_sessions()
    yield
    monkeypatch.undo()
    reset_sessions()
