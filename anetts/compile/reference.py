"""Rule `reference`: the family's shared example run for one bucket size (upstream's tensors at every
stage boundary), which the exports of stages that declare `uses_reference` read. Its own module, so
an edit to the export code does not rerun the reference jobs (Fish's is the longest of a build)."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from anetts.artifacts import atomic_outputs, clear_outputs
from anetts.stage import Family

log = logging.getLogger(__name__)


def load_reference(path: Path | None) -> dict | None:
    if path is None:
        return None
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def write_reference(family: Family, size: int, weights_dir: Path, out: Path, **params) -> dict:
    """The run as an .npz of named arrays. `params`: the run's other config parameters
    (`FamilyDecl.reference_params`, e.g. Fish's frames)."""
    clear_outputs(out)
    t0 = time.perf_counter()
    ref = family.make_reference(family.load_reference_model(weights_dir), Path(weights_dir), size, **params)
    with atomic_outputs(out) as (tmp,):
        with open(tmp, "wb") as f:
            np.savez(f, **ref)
    log.info("reference for size %s in %.1fs", size, time.perf_counter() - t0)
    return ref
