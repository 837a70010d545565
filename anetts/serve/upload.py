"""Reference clips from uploads: read in a child process, header first, never decoded past the limit.

An upload is bytes from a stranger handed to libsndfile. Two things are guarded against:

- **Size.** A FLAC of an hour of silence is half a megabyte and 600 MB decoded. The header's rate,
  channels and length are checked before any sample is read, and at most ``limit + 1`` frames are
  ever decoded, so a header that understates its length is caught after a bounded read too.
- **Crashes.** A codec library that crashes on crafted input would take the whole server with it
  (libsndfile's Vorbis encoder segfaults writing minutes of audio to a file object, seen while
  writing this module's fuzz test). So the decode runs in a child process (:class:`ClipReader`): a
  crash there is a 400 naming the upload, and the next upload gets a fresh child.

Importing this module imports neither the web framework nor the models (the child imports it).
"""
from __future__ import annotations

import asyncio
import io
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import numpy as np


class ClipError(ValueError):
    """An upload that is not a usable reference clip; the message says why (safe to show the client)."""


@dataclass(frozen=True)
class ClipLimit:
    """What a reference clip may be: its rate, channels and length, checked from its header."""

    sample_rate: int
    max_samples: int
    max_channels: int = 2


def read_clip(data: bytes, filename: str | None, limit: ClipLimit, field: str = "audio_sample") -> tuple[np.ndarray, int]:
    """(samples, rate) of an uploaded clip, (n,) or (n, channels) float32; ClipError (naming ``field``,
    the request's field that sent it, and the file name if any) otherwise."""
    import soundfile as sf

    shown = field + (f" {str(filename)[:80]!r}" if filename else " the upload" if field == "audio_sample" else "")

    def bad(why: str) -> ClipError:
        return ClipError(f"{shown}: {why}")

    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate, channels, frames = f.samplerate, f.channels, f.frames
            if rate != limit.sample_rate:
                raise bad(f"is {rate} Hz; this model's reference clips are {limit.sample_rate} Hz (resample it)")
            if not 1 <= channels <= limit.max_channels:
                raise bad(f"has {channels} channels; give mono or stereo")
            if frames > limit.max_samples:
                raise bad(f"is {frames / rate:.2f} s long; this model takes at most {limit.max_samples / rate:.2f} s "
                          f"({limit.max_samples} samples)")
            clip = f.read(frames=limit.max_samples + 1, dtype="float32", always_2d=True)
    except ClipError:
        raise
    except (RuntimeError, ValueError, TypeError, EOFError) as e:  # soundfile's LibsndfileError is a RuntimeError
        # libsndfile's message names the file object (a heap address): say only what it found
        why = getattr(e, "error_string", None) or type(e).__name__
        raise bad(f"is not audio this server can read ({why}); send wav, flac or ogg") from None
    if clip.shape[0] > limit.max_samples:
        raise bad(f"decodes to more than {limit.max_samples / rate:.2f} s although its header says "
                  f"{frames / rate:.2f} s")
    return (clip[:, 0] if clip.shape[1] == 1 else clip), rate


class ClipReader:
    """Runs a function (``read_clip``) in one spawned child process, started on first use. If the child
    dies, the call raises ClipError and the next call starts a new child."""

    def __init__(self):
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                # spawn, not fork: the server's process holds model threads and locks a fork would copy
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
            return self._pool

    async def call(self, fn, *args, what: str = "the upload"):
        pool = self._executor()
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except BrokenProcessPool:
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise ClipError(f"{what} could not be decoded: the decoder stopped on it") from None

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
