"""A prompt's fixed prefix prefilled once: the slow chunks' KV states after it, kept by its content.

Every Fish prompt opens with the system turn (`prompt.system_turn`); with a cloned voice it holds the
reference transcript and codes, the same in every request with that voice and most of its prompt.
The decoder snapshots the slow chunks' states (``Program.copy_state``) after the prefill block that
ends at B = floor(L / P) x P (L: the system turn's rows, P: the prefill block), under the sha256 of
rows [:, :B] and P. A later prompt whose first B rows hash the same starts from copies of those
states and prefills rows B..T only. The snapshots live in an LRU bounded by their bytes
(``--prefix-cache-mb``; 0 keeps none); one cache per runtime, or one a server's workers share; safe to use
from several threads.
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from anetts.runtime.errors import InputError

# S2 Pro's slow KV states at its 1024-row context are 144 MiB a snapshot in fp16 (Core ML, mil) and
# 288 MiB in the torch exports' fp32 (docs/serving.md): this holds 7, or 3, voices
DEFAULT_MB = 1024


def check_cache_mb(value, option: str = "prefix_cache_mb") -> int:
    """A cache cap in MiB: an int >= 0 (0 disables the cache)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InputError(f"{option} must be an integer >= 0 (MiB; 0 disables the prefix cache), got {value!r}",
                         field=option)
    return int(value)


def prefix_key(rows: np.ndarray, block: int) -> str:
    """The content key of prompt rows (1 + num_codebooks, B) prefilled in blocks of `block` rows."""
    h = hashlib.sha256(np.ascontiguousarray(rows, np.int64).tobytes())
    h.update(f"|rows={rows.shape[1]}|block={block}".encode())
    return h.hexdigest()


@dataclass(frozen=True)
class Snapshot:
    """The slow chunks' states (one per chunk, in order) after `rows` prompt rows; never run on, only copied."""

    states: tuple
    rows: int
    nbytes: int


class PrefixCache:
    """Snapshots by content key, least recently used dropped first once their bytes pass `max_bytes`."""

    def __init__(self, max_mb: int = DEFAULT_MB):
        self._entries: OrderedDict[str, Snapshot] = OrderedDict()
        self._lock = threading.Lock()
        self.max_bytes = check_cache_mb(max_mb) << 20
        self.hits = self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(s.nbytes for s in self._entries.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._entries

    def resize(self, max_mb: int) -> None:
        """A new cap (MiB); the least recently used snapshots past it are dropped now."""
        max_bytes = check_cache_mb(max_mb) << 20
        with self._lock:
            self.max_bytes = max_bytes
            self._evict(0)

    def get(self, key: str) -> Snapshot | None:
        with self._lock:
            snap = self._entries.get(key)
            if snap is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return snap

    def fits(self, nbytes: int) -> bool:
        """Whether a snapshot of `nbytes` goes in without dropping one."""
        with self._lock:
            return sum(s.nbytes for s in self._entries.values()) + nbytes <= self.max_bytes

    def put(self, key: str, snap: Snapshot) -> bool:
        """Keep `snap` (dropping the least recently used to make room); False if it is larger than the cap."""
        with self._lock:
            if snap.nbytes > self.max_bytes:
                return False
            self._entries.pop(key, None)
            self._evict(snap.nbytes)
            self._entries[key] = snap
            return True

    def _evict(self, room: int) -> None:
        used = sum(s.nbytes for s in self._entries.values())
        while self._entries and used + room > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            used -= dropped.nbytes
