"""Kokoro model configs for the synthetic weight presets.

`kokoro-82m` is the published Kokoro-82M v1.0 config (copied from the model card's
config.json into `data/`). `kokoro-tiny` keeps the architecture and vocab but shrinks
every dimension that upstream lets us shrink (ALBERT, LSTM depth, vocoder resblocks), so a full build takes minutes.
"""
from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"


@lru_cache(maxsize=None)
def _real_config() -> dict:
    return json.loads((DATA_DIR / "kokoro-82m.config.json").read_text(encoding="utf-8"))


def _tiny_config() -> dict:
    cfg = copy.deepcopy(_real_config())
    # hidden_dim and style_dim stay: upstream hard-codes 512 (decoder.asr_res input) and
    # 128 (ref_s split in KModel.forward_with_tokens), so they are not free parameters.
    cfg["n_layer"] = 1
    cfg["plbert"] = {
        "hidden_size": 64,
        "num_attention_heads": 2,
        "intermediate_size": 128,
        # ALBERT shares one layer; positions must still cover the 512-token context
        "max_position_embeddings": 512,
        "num_hidden_layers": 2,
        "dropout": 0.1,
    }
    # upsample_initial_channel stays 512 (the decoder's last block outputs 512 channels);
    # one resblock kernel per upsampling level instead of three keeps the structure.
    cfg["istftnet"] = dict(cfg["istftnet"], resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1, 3, 5]])
    return cfg


PRESETS = {
    "kokoro-82m": _real_config,
    "kokoro-tiny": _tiny_config,
}


def preset_config(name: str) -> dict:
    """The model config (upstream config.json layout) of a synthetic preset."""
    if name not in PRESETS:
        raise ValueError(f"unknown Kokoro preset {name!r}; choose one of {sorted(PRESETS)}")
    return copy.deepcopy(PRESETS[name]())
