"""Typed view of a Fish S2 `config.json` (`model_type: fish_qwen3_omni`).

The file nests the slow AR under `text_config` and the fast AR under `audio_decoder_config`;
semantic-token ids sit at the top level. Everything downstream (tensor spec, loader, reference,
stages) reads dimensions from `FishConfig`, never from the raw dict.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

MODEL_TYPE = "fish_qwen3_omni"
CONFIG_NAME = "config.json"


class FishConfigError(ValueError):
    """A config.json that cannot describe a Fish S2 model; the message names the key."""


@dataclass(frozen=True)
class ARDims:
    """One transformer of the Dual-AR (slow = text model, fast = audio decoder)."""

    n_layer: int
    dim: int
    n_head: int
    n_local_heads: int  # KV heads
    head_dim: int  # not dim // n_head in S2 (32 * 128 = 4096 != 2560)
    intermediate_size: int
    vocab_size: int  # slow: text + special + semantic ids; fast: codebook size
    rope_base: float
    norm_eps: float
    max_seq_len: int
    qk_norm: bool
    tie_word_embeddings: bool

    @property
    def q_size(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_local_heads * self.head_dim

    @property
    def gqa_group(self) -> int:
        """Query heads per KV head; query head h reads KV head h // gqa_group."""
        return self.n_head // self.n_local_heads


@dataclass(frozen=True)
class FishConfig:
    slow: ARDims
    fast: ARDims
    num_codebooks: int  # codebook rows 1..num_codebooks of the slow input
    codebook_size: int  # = fast.vocab_size
    semantic_begin_id: int  # <|semantic:0|>
    semantic_end_id: int  # <|semantic:codebook_size-1|>
    im_end_id: int  # eos_token_id: the only non-semantic token the sampler may emit
    pad_token_id: int
    audio_pad_token_id: int

    @property
    def n_semantic(self) -> int:
        return self.semantic_end_id - self.semantic_begin_id + 1

    @property
    def restricted_ids(self) -> tuple[int, ...]:
        """Token id of each row of the restricted head (the last slow chunk's `logits`): the semantic ids in order, then
        <|im_end|> (kept here, torch-free, for the runtime's sampler)."""
        return (*range(self.semantic_begin_id, self.semantic_end_id + 1), self.im_end_id)

    @property
    def semantic_scale(self) -> float:
        """Semantic positions of the slow input are divided by this (upstream scale_codebook_embeddings)."""
        return math.sqrt(self.num_codebooks + 1)

    @classmethod
    def from_dict(cls, data: dict, where: str = CONFIG_NAME) -> "FishConfig":
        if data.get("model_type") != MODEL_TYPE:
            raise FishConfigError(f"{where}: model_type is {data.get('model_type')!r}, expected {MODEL_TYPE!r}")
        text = _section(data, "text_config", where)
        audio = _section(data, "audio_decoder_config", where)
        for section, name in ((text, "text_config"), (audio, "audio_decoder_config")):
            if section.get("use_moe"):
                raise FishConfigError(f"{where}: {name}.use_moe is true; only the dense S2 model is supported")
        slow = _dims(text, "text_config", where, text)
        # Upstream builds the fast AR with dataclasses.replace(slow_config, ...): rope_base and
        # norm_eps come from the slow AR, audio_decoder_config's own values are never read.
        fast = _dims(audio, "audio_decoder_config", where, text)
        num_codebooks = _int(audio, "num_codebooks", "audio_decoder_config", where)
        cfg = cls(
            slow=slow, fast=fast, num_codebooks=num_codebooks, codebook_size=fast.vocab_size,
            semantic_begin_id=_int(data, "semantic_start_token_id", "", where),
            semantic_end_id=_int(data, "semantic_end_token_id", "", where),
            im_end_id=_int(data, "eos_token_id", "", where),
            pad_token_id=_int(data, "pad_token_id", "", where),
            audio_pad_token_id=_int(data, "audio_pad_token_id", "", where),
        )
        text_dim = audio.get("text_dim", slow.dim)
        cfg._check(where, text_dim)
        return cfg

    @classmethod
    def from_json(cls, path: Path) -> "FishConfig":
        return cls.from_dict(read_config_json(path), str(path))

    def _check(self, where: str, text_dim: int) -> None:
        for name, d in (("text_config", self.slow), ("audio_decoder_config", self.fast)):
            if d.n_local_heads <= 0 or d.n_head % d.n_local_heads:
                raise FishConfigError(f"{where}: {name}.n_head {d.n_head} is not a multiple of "
                                      f"n_local_heads {d.n_local_heads}")
            if d.dim % d.n_head:  # upstream Attention asserts this
                raise FishConfigError(f"{where}: {name}.dim {d.dim} is not a multiple of n_head {d.n_head}")
            if d.head_dim % 2:
                raise FishConfigError(f"{where}: {name}.head_dim {d.head_dim} must be even (RoPE rotates pairs)")
        if self.fast.dim != self.slow.dim or text_dim != self.slow.dim:
            # S2 has no fast_project_in tensor: the fast AR takes the slow hidden state as is.
            raise FishConfigError(f"{where}: audio_decoder_config.dim {self.fast.dim} / text_dim {text_dim} differ "
                                  f"from text_config.dim {self.slow.dim}; a projected fast AR is not supported")
        if self.n_semantic != self.codebook_size:
            raise FishConfigError(
                f"{where}: semantic ids {self.semantic_begin_id}..{self.semantic_end_id} are {self.n_semantic} "
                f"tokens, but audio_decoder_config.vocab_size is {self.codebook_size}")
        for name in ("semantic_end_id", "im_end_id", "pad_token_id", "audio_pad_token_id"):
            if not 0 <= getattr(self, name) < self.slow.vocab_size:
                raise FishConfigError(f"{where}: {name} {getattr(self, name)} is outside the text vocab "
                                      f"(vocab_size {self.slow.vocab_size})")
        if self.semantic_begin_id <= self.im_end_id <= self.semantic_end_id:
            raise FishConfigError(f"{where}: eos_token_id {self.im_end_id} lies inside the semantic range")


def read_config_json(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FishConfigError(f"missing weight file: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise FishConfigError(f"{path} is not valid JSON: {e}") from e


def _section(data: dict, key: str, where: str) -> dict:
    section = data.get(key)
    if not isinstance(section, dict):
        raise FishConfigError(f"{where}: missing section {key!r}")
    return section


def _get(section: dict, key: str, prefix: str, where: str):
    if key not in section:
        raise FishConfigError(f"{where}: missing key {prefix + '.' if prefix else ''}{key}")
    return section[key]


def _int(section: dict, key: str, prefix: str, where: str) -> int:
    value = _get(section, key, prefix, where)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FishConfigError(f"{where}: {prefix + '.' if prefix else ''}{key} must be a non-negative "
                              f"integer, got {value!r}")
    return value


def _dims(section: dict, prefix: str, where: str, slow_section: dict) -> ARDims:
    def i(key):
        return _int(section, key, prefix, where)

    for key in ("attention_qkv_bias", "attention_o_bias"):
        if section.get(key):
            raise FishConfigError(f"{where}: {prefix}.{key} is true; S2 attention has no biases")
    n_head = i("n_head")
    return ARDims(
        n_layer=i("n_layer"), dim=i("dim"), n_head=n_head,
        n_local_heads=int(section.get("n_local_heads", n_head)),
        head_dim=i("head_dim"), intermediate_size=i("intermediate_size"), vocab_size=i("vocab_size"),
        rope_base=float(_get(slow_section, "rope_base", "text_config", where)),
        norm_eps=float(_get(slow_section, "norm_eps", "text_config", where)),
        max_seq_len=i("max_seq_len"),
        qk_norm=bool(section.get("attention_qk_norm", False)),
        tie_word_embeddings=bool(section.get("tie_word_embeddings", prefix == "text_config")),
    )


def chunk_bounds(n_layer: int, n_chunks: int) -> list[tuple[int, int]]:
    """Contiguous [a, b) ranges, the first ones one layer longer when n_layer % n_chunks != 0."""
    if not 1 <= n_chunks <= n_layer:
        raise ValueError(f"{n_chunks} chunks for {n_layer} layers (a chunk holds at least one layer)")
    q, r = divmod(n_layer, n_chunks)
    out, a = [], 0
    for k in range(n_chunks):
        b = a + q + (k < r)
        out.append((a, b))
        a = b
    return out
