"""The fish-tiny workflow config the Fish tests build with (one bucket, fewer frames: CI stays short)."""
from __future__ import annotations

import yaml

from workflow_helpers import REPO

MODEL = "fish-tiny"


def fish_config(weights_dir=None, frames: int = 72) -> dict:
    """The repo config with fish-tiny the model; fewer frames than the default keeps CI short
    (still >= 64 decode steps per slow chunk and >= 64 frames for the fast AR)."""
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["model"] = MODEL
    cfg["families"]["fish"]["scenario_frames"] = frames
    for name, st in cfg["families"]["fish"]["stages"].items():
        if name != "codec":  # frames, not context: fish-tiny's own [8] applies
            st["buckets"] = [256]
    if weights_dir is not None:
        cfg["models"][MODEL]["weights"] = {"source": "local", "path": str(weights_dir)}
    return cfg
