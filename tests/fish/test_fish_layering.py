"""Opening a Fish build for a runtime backend imports no torch and no build module (issue #22):
the runtime's row ids of the restricted head come from the config, not stages/lm_head.py."""
from __future__ import annotations

import sys

import pytest

from layering import build_modules, probe


@pytest.mark.parametrize("backend", ["mil", "coreml"])
def test_loading_a_fish_build_imports_no_torch(model_dir, backend):
    seen = probe(model_dir, backend)
    if backend == "coreml" and sys.platform != "darwin":
        assert seen["error"].startswith("BackendUnavailable: the coreml backend needs macOS")
    else:
        assert seen["error"] is None
    assert build_modules(seen["load"]) == []


def test_restricted_ids_are_the_heads_rows(fish_tiny):
    from anetts.models.fish.config import FishConfig
    from anetts.models.fish.stages.lm_head import restricted_ids

    cfg = FishConfig.from_json(fish_tiny / "config.json")
    ids = restricted_ids(cfg)
    assert ids.dtype.name == "int64" and list(ids) == list(cfg.restricted_ids)
    assert ids[0] == cfg.semantic_begin_id and ids[-2] == cfg.semantic_end_id and ids[-1] == cfg.im_end_id
