"""A deterministic `tokenizer.json` for the synthetic presets, in the id layout of S2 Pro.

S2 Pro's text vocab is Qwen3's: 151,643 byte-level BPE tokens, then special tokens, then the
4096 `<|semantic:i|>` tokens, then padding rows up to a multiple of 64 (155,776). The config pins
`<|im_end|>` = base + 2, `<|pad|>` = base + 26, `<|audio_pad|>` = base + 34 and the semantic range
from base + 35. The synthetic tokenizer reproduces that layout for any base size: byte tokens first
(no merges, so every string encodes, one token per byte), inert filler tokens up to the base, then
the specials. Names at offsets the config does not pin (3..25, 27..33) are placeholders; the
modality tokens are placed in the order fish-speech's tokenizer lists them.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

TOKENIZER_NAME = "tokenizer.json"
SEMANTIC_TEMPLATE = "<|semantic:{i}|>"
# Qwen2/Qwen3 pre-tokenizer split pattern
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_PINNED = {0: "<|endoftext|>", 1: "<|im_start|>", 2: "<|im_end|>", 26: "<|pad|>", 27: "<|phoneme_start|>",
           28: "<|phoneme_end|>", 29: "<|text|>", 30: "<|voice|>", 31: "<|interleave|>",
           32: "<|audio_start|>", 33: "<|audio_end|>", 34: "<|audio_pad|>"}
SEMANTIC_OFFSET = 35


class TokenizerError(ValueError):
    pass


def id_layout(text_vocab: int, codebook_size: int) -> dict:
    """Special-token ids, the semantic range and the padded vocab size for a base of `text_vocab`."""
    layout = {name: text_vocab + off for off, name in _PINNED.items()}
    begin = text_vocab + SEMANTIC_OFFSET
    end = begin + codebook_size - 1
    layout.update(semantic_begin=begin, semantic_end=end, vocab_size=-(-(end + 1) // 64) * 64)
    return layout


@lru_cache(maxsize=1)
def _byte_chars() -> tuple[str, ...]:
    """GPT-2 byte-to-unicode table: the printable character that stands for each byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return tuple(table[b] for b in range(256))


def tokenizer_json(text_vocab: int, codebook_size: int) -> dict:
    if text_vocab < 256:
        raise TokenizerError(f"text_vocab {text_vocab} is below the 256 byte tokens")
    layout = id_layout(text_vocab, codebook_size)
    vocab = {c: b for b, c in enumerate(_byte_chars())}
    # ids 256..text_vocab-1 exist in the model (their embedding rows are real) but no byte
    # sequence reaches them without merges
    vocab.update({f"<|unused_text_{i}|>": i for i in range(256, text_vocab)})
    specials = []
    for i in range(text_vocab, layout["vocab_size"]):
        off = i - text_vocab
        if off in _PINNED:
            name = _PINNED[off]
        elif layout["semantic_begin"] <= i <= layout["semantic_end"]:
            name = SEMANTIC_TEMPLATE.format(i=i - layout["semantic_begin"])
        else:
            name = f"<|reserved_{off}|>"
        specials.append({"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                         "normalized": False, "special": True})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": specials, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT_PATTERN}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": None,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def write_tokenizer(path: Path, text_vocab: int, codebook_size: int) -> None:
    Path(path).write_text(json.dumps(tokenizer_json(text_vocab, codebook_size), ensure_ascii=False),
                          encoding="utf-8")


def load_tokenizer(path: Path, config=None):
    """A `tokenizers.Tokenizer`; with a FishConfig, checks that its special ids match the config."""
    from tokenizers import Tokenizer

    path = Path(path)
    if not path.is_file():
        raise TokenizerError(f"missing weight file: {path}")
    try:
        tk = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises plain Exception subclasses for malformed files
        raise TokenizerError(f"cannot read tokenizer {path}: {e}") from e
    if config is not None:
        want = {"<|im_end|>": config.im_end_id, SEMANTIC_TEMPLATE.format(i=0): config.semantic_begin_id,
                SEMANTIC_TEMPLATE.format(i=config.codebook_size - 1): config.semantic_end_id}
        for name, token_id in want.items():
            got = tk.token_to_id(name)
            if got != token_id:
                raise TokenizerError(f"{path}: token {name} has id {got}, config.json says {token_id}")
        if tk.get_vocab_size() > config.slow.vocab_size:
            raise TokenizerError(f"{path}: {tk.get_vocab_size()} tokens exceed the model vocab "
                                 f"{config.slow.vocab_size}")
    return tk
