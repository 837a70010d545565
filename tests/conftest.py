"""Shared fixtures: tiny synthetic weights and one small end-to-end workflow build."""
from __future__ import annotations

from pathlib import Path

import pytest

from workflow_helpers import make_workflow_copy, run_snakemake, small_config


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory) -> Path:
    """Synthetic kokoro-tiny weights, materialized once per session."""
    from anetts.weights import materialize_weights

    out = tmp_path_factory.mktemp("weights") / "weights"
    materialize_weights("kokoro", {"source": "synthetic", "preset": "kokoro-tiny", "seed": 0}, out)
    return out


@pytest.fixture(scope="session")
def tiny_model(tiny_weights):
    from anetts.families import get_family

    return get_family("kokoro").load_model(tiny_weights, None)


@pytest.fixture(scope="session")
def built_workflow(tmp_path_factory, tiny_weights) -> Path:
    """kokoro-tiny built end to end by `snakemake all` (one bucket per stage)."""
    workdir = make_workflow_copy(tmp_path_factory.mktemp("wf"), small_config(tiny_weights))
    run_snakemake(workdir, "all")
    return workdir
