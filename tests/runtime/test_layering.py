"""Layering a user can feel (issue #22): `import anetts` and opening a Kokoro build for a runtime
backend import no torch and no build module; anetts/runtime/ imports no publish/ and no family."""
from __future__ import annotations

import sys

import pytest

from layering import build_modules, probe, runtime_imports


def test_import_anetts_loads_no_torch_and_no_build_module(model_dir):
    seen = probe(model_dir, "mil")
    assert build_modules(seen["import"]) == []
    # the mil runner is the one that brings torch (the MIL executor runs on it), on first use only:
    # opening the model for it imports what a Core ML load imports besides Core ML
    assert seen["error"] is None
    assert build_modules(seen["load"]) == []


@pytest.mark.skipif(sys.platform == "darwin", reason="Core ML runs on macOS")
def test_a_coreml_load_imports_no_torch(model_dir):
    seen = probe(model_dir, "coreml")
    assert seen["error"].startswith("BackendUnavailable: the coreml backend needs macOS")
    assert build_modules(seen["load"]) == []


def test_runtime_imports_no_publish_and_no_family():
    for name, imports in runtime_imports().items():
        bad = [m for m in imports if m.startswith(("anetts.publish", "anetts.models", "anetts.compile",
                                                   "anetts.verify", "anetts.loader"))]
        assert bad == [], f"anetts/runtime/{name} imports {bad}"
