"""Cloned voices: who owns them, how many there may be, and where they are kept.

A :class:`VoiceStore` keeps each voice's encoded reference (its codes and transcript, what the runtime
takes), name, owner, creation time and consent note. Without a directory it keeps them in memory (lost
when the server stops); with one (``anetts serve --voice-dir DIR``) each voice is one file
``DIR/<id>.voice``, written atomically (:func:`anetts.artifacts.atomic_file`) and read back at start::

    anetts-voice/1 sha256=<hex digest of the payload> bytes=<payload length>\\n
    <payload: one JSON object; the codes as base64 of their little-endian bytes, with dtype and shape>

A file whose first line is not that header (foreign), whose payload is shorter or longer than it says
(truncated), whose digest differs (corrupt) or whose payload does not hold a voice is refused by its file
name, logged as a warning, and the others still load. A deleted voice's file is removed.

Owners: the id :func:`anetts.serve.guard.key_owner` gives for a request's key (a hash, never the key),
or None on a server without keys. A voice is seen, used, fetched and deleted only by its owner; to
anyone else it does not exist. Caps: ``max_per_owner`` voices per owner and ``max_bytes`` for the whole
store (the sum of the voices' file sizes, the same in memory and on disk).
"""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from anetts.runtime.speech import Reference

log = logging.getLogger("anetts.serve")

MAGIC = "anetts-voice/1"
SUFFIX = ".voice"
ID_PATTERN = re.compile(r"voice_[0-9a-f]{16}")
_HEADER = re.compile(rf"{re.escape(MAGIC)} sha256=([0-9a-f]{{64}}) bytes=([0-9]{{1,12}})")
_CODE_DTYPES = ("int16", "int32", "int64", "uint16", "uint8", "int8")


class StoreFull(Exception):
    """A voice that would go past a cap; ``cap`` names it (the flag that sets it), the message says how."""

    def __init__(self, cap: str, message: str):
        super().__init__(message)
        self.cap = cap


class VoiceFileError(ValueError):
    """A voice file that cannot be taken back (foreign, truncated, corrupt); the message says which and why."""


@dataclass(frozen=True)
class StoredVoice:
    id: str
    name: str
    reference: Reference
    created_at: int
    owner: str | None = None  # guard.key_owner's id for the key that made it; None without keys
    consent: str | None = None  # the consent note sent with the clip, kept as given

    def public(self) -> dict:
        """OpenAI's voice object."""
        return {"id": self.id, "object": "audio.voice", "name": self.name, "created_at": self.created_at}


def new_id() -> str:
    return f"voice_{secrets.token_hex(8)}"


# ------------------------------------------------------------------------------------ the file format

def encode_voice(v: StoredVoice) -> bytes:
    """A voice as the bytes of its file (header line, then the payload it checks)."""
    codes = np.ascontiguousarray(v.reference.codes)
    dtype = codes.dtype.newbyteorder("<")
    payload = json.dumps({
        "id": v.id, "name": v.name, "owner": v.owner, "created_at": int(v.created_at), "consent": v.consent,
        "text": v.reference.text, "codes": {"dtype": dtype.name, "shape": list(codes.shape),
                                            "data": base64.b64encode(codes.astype(dtype).tobytes()).decode()},
    }, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")
    header = f"{MAGIC} sha256={hashlib.sha256(payload).hexdigest()} bytes={len(payload)}\n".encode()
    return header + payload


def decode_voice(data: bytes, where: str) -> StoredVoice:
    """The voice in a file's bytes; VoiceFileError naming ``where`` for anything else."""
    def bad(why: str) -> VoiceFileError:
        return VoiceFileError(f"{where}: {why}")

    head, nl, payload = data.partition(b"\n")
    m = _HEADER.fullmatch(head.decode("ascii", "replace")) if nl else None
    if m is None:
        raise bad(f"not an ane-tts voice file (its first line is not '{MAGIC} sha256=... bytes=...')")
    digest, size = m.group(1), int(m.group(2))
    if len(payload) != size:
        raise bad(f"truncated or padded: {len(payload)} bytes of payload where its header says {size}")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise bad("corrupt: its sha256 does not match its header")
    try:
        d = json.loads(payload.decode("utf-8"))
        c = d["codes"]
        if c["dtype"] not in _CODE_DTYPES:
            raise ValueError(f"codes of dtype {c['dtype']!r}")
        shape = tuple(int(n) for n in c["shape"])
        codes = np.frombuffer(base64.b64decode(c["data"], validate=True), np.dtype(c["dtype"]).newbyteorder("<"))
        codes = codes.reshape(shape).astype(np.dtype(c["dtype"]))
        if codes.ndim != 2:
            raise ValueError(f"codes of shape {shape}, not (codebooks, frames)")
        for k in ("id", "name", "text"):
            if not isinstance(d[k], str):
                raise TypeError(f"{k} is not a string")
        if not ID_PATTERN.fullmatch(d["id"]):
            raise ValueError(f"id {d['id'][:40]!r} is not a voice id")
        if not (d["owner"] is None or isinstance(d["owner"], str)) or not (
                d["consent"] is None or isinstance(d["consent"], str)):
            raise ValueError("owner or consent is neither a string nor null")
        return StoredVoice(d["id"], d["name"], Reference(d["text"], codes), int(d["created_at"]), d["owner"],
                           d["consent"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise bad(f"its payload does not hold a voice ({type(e).__name__}: {str(e)[:120]})") from None


# ------------------------------------------------------------------------------------ the store

class VoiceStore:
    """The server's cloned voices, by id; thread-safe (registrations run on the pool's threads)."""

    def __init__(self, directory: Path | None = None, *, max_per_owner: int = 20, max_bytes: int = 256 << 20):
        self.directory = None if directory is None else Path(directory)
        self.max_per_owner, self.max_bytes = max_per_owner, max_bytes
        self._voices: dict[str, StoredVoice] = {}
        self._sizes: dict[str, int] = {}
        self._lock = threading.Lock()
        self.refused: list[str] = []  # the files refused at load, each with why
        if self.directory is not None:
            self._load()

    @property
    def persistent(self) -> bool:
        return self.directory is not None

    def _path(self, voice_id: str) -> Path:
        assert self.directory is not None and ID_PATTERN.fullmatch(voice_id), voice_id
        return self.directory / f"{voice_id}{SUFFIX}"

    def _load(self) -> None:
        d = self.directory
        try:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            entries = sorted(d.iterdir())
        except OSError as e:
            from anetts.runtime.errors import TTSError

            raise TTSError(f"the voice directory {d} cannot be used: {e.strerror or e}") from None
        for p in entries:
            if p.name.startswith("."):  # an atomic write's temporary, left by a crash: never a voice
                if p.name.endswith(".tmp" + SUFFIX) and p.is_file():
                    p.unlink(missing_ok=True)
                continue
            try:
                if not (p.name.endswith(SUFFIX) and ID_PATTERN.fullmatch(p.name[:-len(SUFFIX)])):
                    raise VoiceFileError(f"{p.name}: not a voice file's name (voice_<16 hex>{SUFFIX}); left as it is")
                if not p.is_file():
                    raise VoiceFileError(f"{p.name}: not a regular file")
                data = p.read_bytes()
                v = decode_voice(data, p.name)
                if p.name != f"{v.id}{SUFFIX}":
                    raise VoiceFileError(f"{p.name}: holds voice {v.id}, not the one its name says")
            except (OSError, VoiceFileError) as e:
                why = str(e) if isinstance(e, VoiceFileError) else f"{p.name}: cannot be read ({e.strerror})"
                log.warning("voice file refused: %s", why)
                self.refused.append(why)
                continue
            self._voices[v.id], self._sizes[v.id] = v, len(data)
        log.info("voice store %s: %d voices loaded, %d files refused", d, len(self._voices), len(self.refused))

    # -- reads: an owner sees its own voices only

    def list(self, owner: str | None) -> list[StoredVoice]:
        with self._lock:
            return sorted((v for v in self._voices.values() if v.owner == owner), key=lambda v: (v.created_at, v.id))

    def newest(self) -> list[StoredVoice]:
        """Every owner's voices, the newest first (what the server prefills at start, as its cache holds them)."""
        with self._lock:
            return sorted(self._voices.values(), key=lambda v: (v.created_at, v.id), reverse=True)

    def get(self, id_or_name: str, owner: str | None) -> StoredVoice | None:
        """An owner's voice by id, else by name (the newest of that name); None if it has none such."""
        with self._lock:
            v = self._voices.get(id_or_name)
            if v is not None:
                return v if v.owner == owner else None
            named = [v for v in self._voices.values() if v.owner == owner and v.name == id_or_name]
        return max(named, key=lambda v: (v.created_at, v.id)) if named else None

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._voices)

    # -- writes

    def check_room(self, owner: str | None, size: int = 0) -> None:
        """StoreFull if ``owner`` has no room for one more voice (of ``size`` bytes)."""
        with self._lock:
            self._room(owner, size)

    def _room(self, owner: str | None, size: int) -> None:
        mine = sum(1 for v in self._voices.values() if v.owner == owner)
        if mine >= self.max_per_owner:
            raise StoreFull("max_voices", f"{'this key' if owner else 'this server'} has {mine} voices, the most "
                                          f"this server keeps per owner "
                                          f"(--max-voices {self.max_per_owner}); delete one first")
        total = sum(self._sizes.values())
        if total + size > self.max_bytes:
            raise StoreFull("max_voice_bytes", f"the voice store holds {total} bytes; this voice's {size} more "
                                               f"would pass its cap (--max-voice-bytes {self.max_bytes})")

    def add(self, v: StoredVoice) -> StoredVoice:
        """Keep ``v`` (on disk first, when there is a directory); StoreFull past a cap."""
        data = encode_voice(v)
        with self._lock:  # held over the write, so two registrations cannot both take the last room
            if v.id in self._voices:
                raise ValueError(f"voice {v.id} exists")
            self._room(v.owner, len(data))
            if self.directory is not None:
                from anetts.artifacts import atomic_file

                with atomic_file(self._path(v.id)) as tmp:  # readable by the server's user only
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
            self._voices[v.id], self._sizes[v.id] = v, len(data)
        return v

    def create(self, name: str, reference: Reference, owner: str | None, consent: str | None = None) -> StoredVoice:
        return self.add(StoredVoice(new_id(), name, reference, int(time.time()), owner, consent))

    def delete(self, voice_id: str, owner: str | None) -> bool:
        """Remove an owner's voice, its file included; False if the owner has no voice of that id."""
        with self._lock:
            v = self._voices.get(voice_id)
            if v is None or v.owner != owner:
                return False
            if self.directory is not None:
                path = self._path(voice_id)
                path.unlink(missing_ok=True)
                fd = os.open(self.directory, os.O_RDONLY)
                try:
                    os.fsync(fd)  # the removal is on disk before the client hears it is done
                finally:
                    os.close(fd)
            del self._voices[voice_id], self._sizes[voice_id]
        return True
