"""Fish S2 configs of the synthetic weight presets, in the published `config.json` layout.

`fish-s2-pro` has the dimensions of fishaudio/s2-pro (36 slow layers, dim 2560, 32/8 heads of
128, FFN 9728, vocab 155,776, 4 fast layers, 10 codebooks of 4096; about 4.56 B parameters).
`fish-tiny` keeps every property a conversion can get wrong (heads x head_dim != dim, GQA 4:1,
QK norm, 10 codebooks, the id layout text < special < semantic < padding) at sizes that build in
well under a second. Each preset names its codec (`codec.pth`): S2 Pro's, or a tiny one.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

from anetts.models.fish import tokenizer as tok


@dataclass(frozen=True)
class Preset:
    config: dict
    text_vocab: int  # ordinary (byte-level BPE) tokens below the first special id
    shard_bytes: int  # shards are cut at this size; the real repository's split is not known here
    # codec.pth beside the checkpoint: "s2-pro" (fish-speech's modded_dac_vq.yaml, 391 M parameters)
    # or "tiny" (the same modules and rates at small widths, anetts.models.fish.codec.tiny_config)
    codec: str = "s2-pro"


def _config(*, text_vocab: int, codebook_size: int, slow: dict, fast: dict) -> dict:
    layout = tok.id_layout(text_vocab, codebook_size)
    common = {
        "dropout": 0.0,
        "attention_qkv_bias": False,
        "attention_o_bias": False,
        "rope_base": 1_000_000.0,
        "norm_eps": 1e-6,
        "use_gradient_checkpointing": False,
        "use_moe": False,
        # the init std of an LLM of this width (1/sqrt(dim)); synthesis draws weights with it
        "initializer_range": slow["dim"] ** -0.5,
    }
    return {
        "model_type": "fish_qwen3_omni",
        "dtype": "bfloat16",
        "eos_token_id": layout["<|im_end|>"],
        "pad_token_id": layout["<|pad|>"],
        "audio_pad_token_id": layout["<|audio_pad|>"],
        "semantic_start_token_id": layout["semantic_begin"],
        "semantic_end_token_id": layout["semantic_end"],
        "sample_rate": 44100,
        "text_config": {
            **common, **slow, "model_type": "fish_qwen3", "vocab_size": layout["vocab_size"],
            "attention_qk_norm": True, "tie_word_embeddings": True,
        },
        "audio_decoder_config": {
            **common, **fast, "model_type": "fish_qwen3_audio_decoder", "vocab_size": codebook_size,
            "attention_qk_norm": False, "tie_word_embeddings": False, "max_seq_len": 11,
            "num_codebooks": 10, "text_dim": slow["dim"],
        },
    }


def _heads(dim: int, n_head: int, n_local_heads: int, head_dim: int, ffn: int, n_layer: int) -> dict:
    return {"dim": dim, "n_head": n_head, "n_local_heads": n_local_heads, "head_dim": head_dim,
            "intermediate_size": ffn, "n_layer": n_layer}


def _s2_pro() -> Preset:
    real = _heads(2560, 32, 8, 128, 9728, 36)
    return Preset(
        config=_config(text_vocab=151_643, codebook_size=4096, slow={**real, "max_seq_len": 32_768},
                       fast=dict(real, n_layer=4)),
        text_vocab=151_643, shard_bytes=2 << 30, codec="s2-pro")


def _tiny() -> Preset:
    # 8 heads x 64 = 512 != dim 256; 8 query heads over 2 KV heads (4:1) as in S2.
    small = _heads(256, 8, 2, 64, 768, 4)
    return Preset(
        config=_config(text_vocab=256, codebook_size=512, slow={**small, "max_seq_len": 1024},
                       fast=dict(small, n_layer=2)),
        text_vocab=256, shard_bytes=4 << 20, codec="tiny")


PRESETS = {"fish-tiny": _tiny, "fish-s2-pro": _s2_pro}


def preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown Fish preset {name!r}; choose one of {sorted(PRESETS)}")
    p = PRESETS[name]()
    return Preset(copy.deepcopy(p.config), p.text_vocab, p.shard_bytes, p.codec)
