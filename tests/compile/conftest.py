"""Helpers for the build-tool tests: convert tiny torch modules into .mlpackages in tmp dirs."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest


def ct():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import coremltools

    return coremltools


def _convert_module(module, example: dict, out: Path, *, outputs=("y",), variant: str = "none",
                   shapes: dict | None = None, metadata: dict | None = None, where: str = "test"):
    """Trace `module` on the example inputs (name -> torch tensor) and save an fp16 macOS13
    ML Program at `out` the way convert.py does; `variant` applies the linear rewrite.
    Returns the rewrite report."""
    import torch

    from anetts.compile.rewrite import convert_with_rewrite

    c = ct()
    module = module.eval()
    traced = torch.jit.trace(module, tuple(example.values()))
    inputs = []
    for name, t in example.items():
        shape = (shapes or {}).get(name, tuple(t.shape))
        dtype = np.int32 if t.dtype in (torch.int32, torch.int64) else np.float32
        inputs.append(c.TensorType(name=name, shape=shape, dtype=dtype))
    outs = [c.TensorType(name=n, dtype=np.float32) for n in outputs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mlmodel, report = convert_with_rewrite(
            traced, variant, where=where, inputs=inputs, outputs=outs, convert_to="mlprogram",
            compute_precision=c.precision.FLOAT16, minimum_deployment_target=c.target.macOS13)
    if metadata:
        mlmodel.user_defined_metadata.update(metadata)
    mlmodel.save(str(out))
    return report


@pytest.fixture(scope="session")
def convert_module():
    """The converter helper above, as a fixture (tests import nothing from conftest)."""
    return _convert_module


@pytest.fixture(scope="session")
def load_program():
    """anetts.mil.load_program (a broken executor fails these tests; it never skips them)."""
    from anetts.mil import load_program

    return load_program
