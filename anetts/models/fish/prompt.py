"""S2's prompt: the Qwen3-style conversation the slow AR is prefilled with, and upstream's text chunking.

One definition shared by the runtime and the upstream reference run (`reference.make_prompt`).
The turns are those of fish-speech's S2 inference (as mlx-audio 0.6.2's port builds them):

    <|im_start|>system\\n convert the provided text to speech reference to the following:\\n\\nText:\\n
        <|speaker:0|>{reference transcript} \\n\\nSpeech:\\n {reference codes}  <|im_end|>\\n
    [<|im_start|>user\\n {earlier chunk} <|im_end|>\\n <|im_start|>assistant\\n<|voice|> {its codes} <|im_end|>\\n]*
    <|im_start|>user\\n {text} <|im_end|>\\n
    <|im_start|>assistant\\n<|voice|>                       (open: the model speaks from here)

Without a reference the system turn is only "convert the provided text to speech". A row of
reference codes sits at semantic ids (row 0 = semantic_begin + code 0, rows 1..10 the codes), every
other position is text with zero code rows. Upstream splits the text at `<|speaker:N|>` tags and
groups the turns into batches of <= `chunk_length` bytes (300); an untagged text is one turn, which
this module further splits at sentence, then clause, then word boundaries when it exceeds the budget
(upstream would send it whole).
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from anetts.models.fish.config import FishConfig

IM_START, IM_END, VOICE = "<|im_start|>", "<|im_end|>", "<|voice|>"
CHUNK_BYTES = 300  # upstream's default chunk_length
MAX_SPEAKERS = 5
SYSTEM_WITH_REFERENCE = "convert the provided text to speech reference to the following:\n\nText:\n"
SYSTEM_PLAIN = "convert the provided text to speech"
SPEECH_HEADER = "\n\nSpeech:\n"
_SPEAKER = re.compile(r"(<\|speaker:\d+\|>)")
# tokens a user's text must not smuggle in: they would open/close turns or switch modality
CONTROL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|voice|>", "<|text|>", "<|interleave|>",
                  "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>", "<|pad|>", "<|phoneme_start|>",
                  "<|phoneme_end|>")


class PromptError(ValueError):
    """Text or reference codes that cannot make a prompt; the message names the problem."""


@dataclass
class Turn:
    """One chat turn as (ids, codes per position or None): codes (num_codebooks, n) for a VQ part."""

    parts: list[tuple[list[int], np.ndarray | None]] = field(default_factory=list)

    @property
    def length(self) -> int:
        return sum(len(ids) for ids, _ in self.parts)


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


def check_codes(cfg: FishConfig, codes, what: str = "reference codes") -> np.ndarray:
    """(num_codebooks, frames) int codes in range, as int64; PromptError naming the problem otherwise."""
    a = np.asarray(codes)
    if a.ndim != 2 or a.shape[0] != cfg.num_codebooks or a.shape[1] < 1:
        raise PromptError(f"{what} must be ({cfg.num_codebooks}, frames) with frames >= 1, got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.integer):
        raise PromptError(f"{what} must be integers, got dtype {a.dtype}")
    lo, hi = int(a.min()), int(a.max())
    if lo < 0 or hi >= cfg.codebook_size:
        bad = np.argwhere((a < 0) | (a >= cfg.codebook_size))[0]
        raise PromptError(f"{what}: code {int(a[tuple(bad)])} at codebook {bad[0]}, frame {bad[1]} is outside "
                          f"0..{cfg.codebook_size - 1}")
    return a.astype(np.int64)


def vq_part(cfg: FishConfig, codes: np.ndarray) -> tuple[list[int], np.ndarray]:
    codes = check_codes(cfg, codes)
    return [int(c) + cfg.semantic_begin_id for c in codes[0]], codes


def system_turn(cfg: FishConfig, tokenizer, reference_text: str | None, reference_codes) -> Turn:
    t = Turn([(_ids(tokenizer, f"{IM_START}system\n"), None)])
    if reference_codes is not None:
        text = reference_text or ""
        tagged = text if "<|speaker:" in text else f"<|speaker:0|>{text}"
        t.parts += [(_ids(tokenizer, SYSTEM_WITH_REFERENCE), None), (_ids(tokenizer, tagged), None),
                    (_ids(tokenizer, SPEECH_HEADER), None), vq_part(cfg, reference_codes)]
    else:
        t.parts.append((_ids(tokenizer, SYSTEM_PLAIN), None))
    t.parts.append((_ids(tokenizer, f"{IM_END}\n"), None))
    return t


def user_turn(tokenizer, text: str) -> Turn:
    return Turn([(_ids(tokenizer, f"{IM_START}user\n"), None), (_ids(tokenizer, text), None),
                 (_ids(tokenizer, f"{IM_END}\n"), None)])


def assistant_turn(cfg: FishConfig, tokenizer, codes=None, close: bool = True) -> Turn:
    """The voice turn around `codes` (None: none yet), closed with <|im_end|> or left open for the
    model to go on speaking."""
    t = Turn([(_ids(tokenizer, f"{IM_START}assistant\n{VOICE}"), None)])
    if codes is not None:
        t.parts.append(vq_part(cfg, codes))
    if close:
        t.parts.append((_ids(tokenizer, f"{IM_END}\n"), None))
    return t


def encode(cfg: FishConfig, turns: Sequence[Turn]) -> np.ndarray:
    """Turns -> the slow AR's (1 + num_codebooks, T) int64 input rows."""
    T = sum(t.length for t in turns)
    rows = np.zeros((cfg.num_codebooks + 1, T), np.int64)
    p = 0
    for t in turns:
        for ids, codes in t.parts:
            rows[0, p:p + len(ids)] = ids
            if codes is not None:
                rows[1:, p:p + len(ids)] = codes
            p += len(ids)
    return rows


def build_prompt(cfg: FishConfig, tokenizer, text: str, reference_text: str | None = None, reference_codes=None,
                 history: Sequence[tuple[str, np.ndarray]] = (), spoken=None) -> np.ndarray:
    """The prompt rows for `text`: system turn (+ reference), earlier (text, codes) chunks, user, open voice
    turn (holding `spoken` (num_codebooks, n) codes already generated for `text`, when a generation
    continues in a fresh context)."""
    turns = [system_turn(cfg, tokenizer, reference_text, reference_codes)]
    for past_text, past_codes in history:
        turns += [user_turn(tokenizer, past_text), assistant_turn(cfg, tokenizer, past_codes)]
    turns += [user_turn(tokenizer, text), assistant_turn(cfg, tokenizer, spoken, close=False)]
    return encode(cfg, turns)


def check_text(cfg: FishConfig, tokenizer, text, what: str = "text") -> str:
    """The text, cleaned as upstream does (strip); PromptError if empty, carrying control tokens or not
    encodable (the tokenizer does not give it back, or gives ids outside the text vocabulary)."""
    if not isinstance(text, str):
        raise PromptError(f"{what} must be a string, got {type(text).__name__}")
    text = text.strip()
    if not text:
        raise PromptError(f"{what} is empty or whitespace only; nothing to speak")
    for tok in CONTROL_TOKENS:
        if tok in text:
            raise PromptError(f"{what} contains the control token {tok}; remove it")
    plain = unicodedata.normalize("NFC", _SPEAKER.sub("", text))
    ids = _ids(tokenizer, plain)
    if unicodedata.normalize("NFC", tokenizer.decode(ids, skip_special_tokens=False)) != plain:
        bad = sorted({ch for ch in text if _ids(tokenizer, ch) == [] or tokenizer.decode(_ids(tokenizer, ch)) != ch})
        raise PromptError(f"{what} has symbols the tokenizer cannot encode: {bad or 'a sequence that does not round-trip'}")
    if any(cfg.semantic_begin_id <= i <= cfg.semantic_end_id for i in ids):
        raise PromptError(f"{what} contains semantic tokens (<|semantic:N|>); give codes as reference_codes instead")
    return text


def split_text_by_speaker(text: str) -> list[str]:
    """Upstream: the `<|speaker:N|>`-tagged turns of `text` (an untagged text has none)."""
    parts = _SPEAKER.split(text)
    turns, i = [], 0
    while i < len(parts):
        part = parts[i].strip()
        if _SPEAKER.fullmatch(part):
            turns.append((part + (parts[i + 1] if i + 1 < len(parts) else "")).strip())
            i += 2
        else:
            i += 1
    return turns


def group_turns(turns: list[str], max_speakers: int = MAX_SPEAKERS, max_bytes: int = CHUNK_BYTES) -> list[str]:
    """Upstream: consecutive turns joined by newlines into batches of <= max_bytes (and <= max_speakers turns)."""
    batches, current, size = [], [], 0
    for turn in turns:
        n = len(turn.encode("utf-8"))
        if len(current) >= max_speakers or (current and size + n > max_bytes):
            batches.append("\n".join(current))
            current, size = [turn], n
        else:
            current.append(turn)
            size += n
    if current:
        batches.append("\n".join(current))
    return batches


_BREAKS = (re.compile(r"(?<=[.!?…。！？])\s+"), re.compile(r"(?<=[,;:—，；：])\s+"), re.compile(r"\s+"))


def split_long(text: str, max_bytes: int) -> list[str]:
    """A text over `max_bytes` split at sentence ends, then clause marks, then spaces (greedy packing);
    a single word longer than the budget stays whole."""
    if len(text.encode("utf-8")) <= max_bytes:
        return [text]
    for pattern in _BREAKS:
        pieces = [p for p in pattern.split(text) if p]
        if len(pieces) > 1:
            break
    else:
        return [text]
    out, cur = [], ""
    for p in pieces:
        cand = f"{cur} {p}" if cur else p
        if cur and len(cand.encode("utf-8")) > max_bytes:
            out.append(cur)
            cur = p
        else:
            cur = cand
    out.append(cur)
    return [q for piece in out for q in split_long(piece, max_bytes)] if len(out) > 1 else out


def chunk_text(text: str, max_bytes: int = CHUNK_BYTES) -> list[str]:
    """Upstream's batches (speaker turns grouped to <= max_bytes), each oversized one split further."""
    if max_bytes < 1:
        raise PromptError(f"chunk length must be >= 1 byte, got {max_bytes}")
    turns = split_text_by_speaker(text)
    batches = group_turns(turns, max_bytes=max_bytes) if turns else [text.strip()]
    return [piece for b in batches for piece in split_long(b, max_bytes)]


def halve(text: str) -> tuple[str, str] | None:
    """Split a chunk near its middle at the best boundary (sentence, clause, space); None if it cannot be."""
    mid = len(text) / 2
    best = None
    for rank, pattern in enumerate(_BREAKS):
        for m in pattern.finditer(text):
            key = (rank, abs(m.start() - mid))
            if best is None or key < best[0]:
                best = (key, m.start(), m.end())
        if best is not None:
            break
    if best is None:
        return None
    left, right = text[:best[1]].strip(), text[best[2]:].strip()
    return (left, right) if left and right else None
