"""Audio encoders of the speech API, all through soundfile (libsndfile): one-shot and streamed.

``pcm`` is raw 16-bit little-endian mono at the model's rate (OpenAI's definition); ``wav`` and
``flac`` are 16-bit; ``mp3`` is MPEG layer III; ``opus`` is Opus in Ogg. libsndfile writes no
AAC, and its Opus encoder takes only 8/12/16/24/48 kHz (Fish speaks at 44.1 kHz).

Streaming writes each chunk through the same libsndfile encoder into a sink that hands on the
bytes as they are made. That needs a format whose bytes, once written, stay as they are: libsndfile
completes the headers of mp3 (the frame count of its Xing/Info frame) and flac (STREAMINFO) by
seeking back at the end, so those two are sent whole only. wav rewrites only its two sizes at the
end; a streamed wav carries 0xFFFFFFFF there instead, the usual "length unknown" of streamed wav.
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass

import numpy as np
import soundfile as sf


class FormatError(ValueError):
    """A response format this server cannot give for this request (the message says why)."""


@dataclass(frozen=True)
class Format:
    name: str
    container: str  # soundfile format
    subtype: str  # soundfile subtype
    media_type: str
    streamable: bool
    rates: tuple[int, ...] | None = None  # sample rates the encoder takes; None: any


FORMATS = {f.name: f for f in (
    Format("pcm", "RAW", "PCM_16", "audio/pcm", True),
    Format("wav", "WAV", "PCM_16", "audio/wav", True),
    Format("flac", "FLAC", "PCM_16", "audio/flac", False),
    Format("mp3", "MP3", "MPEG_LAYER_III", "audio/mpeg", False),
    Format("opus", "OGG", "OPUS", "audio/ogg", True, (8000, 12000, 16000, 24000, 48000)),
)}
UNSUPPORTED = {"aac": "libsndfile (the soundfile encoder this server uses) has no AAC encoder; "
                      "use mp3, opus, flac, wav or pcm"}
WAV_UNKNOWN_SIZE = 0xFFFFFFFF


def check_format(name: str, sample_rate: int, streaming: bool) -> Format:
    """The format ``name`` if this server can encode ``sample_rate`` audio in it (streamed or not)."""
    if name in UNSUPPORTED:
        raise FormatError(f"response_format {name!r} is not supported: {UNSUPPORTED[name]}")
    fmt = FORMATS.get(name)
    if fmt is None:
        raise FormatError(f"response_format {name!r} is unknown; choose one of {sorted(FORMATS)}")
    if fmt.rates is not None and sample_rate not in fmt.rates:
        raise FormatError(f"response_format {name!r} is not available for this model: the Opus encoder takes "
                          f"{list(fmt.rates)} Hz and the model speaks at {sample_rate} Hz; use mp3, flac, wav or pcm")
    if streaming and not fmt.streamable:
        raise FormatError(f"response_format {name!r} cannot be streamed: libsndfile completes its header only "
                          f"after the last sample; stream pcm, wav or opus, or leave stream_format out for a "
                          f"whole {name} file")
    if sf.check_format(fmt.container, fmt.subtype) is False:
        raise FormatError(f"response_format {name!r}: this machine's libsndfile cannot write "
                          f"{fmt.container}/{fmt.subtype}")
    return fmt


def _clipped(audio: np.ndarray) -> np.ndarray:
    # libsndfile converts float to 16-bit without clipping unless told: out-of-range samples would wrap
    return np.clip(np.asarray(audio, np.float32), -1.0, 1.0)


class _Sink(io.RawIOBase):
    """A write-only file for libsndfile whose bytes are taken away as they come. A write that lands
    on bytes already taken (a header completed at the end) is dropped."""

    def __init__(self):
        super().__init__()
        self.pending = bytearray()
        self.taken = 0  # bytes handed on before `pending`
        self.pos = 0

    def readable(self):
        return True

    def writable(self):
        return True

    def seekable(self):
        return True

    def readinto(self, b):
        return 0

    def tell(self):
        return self.pos

    def seek(self, offset, whence=io.SEEK_SET):
        end = self.taken + len(self.pending)
        self.pos = offset if whence == io.SEEK_SET else self.pos + offset if whence == io.SEEK_CUR else end + offset
        return self.pos

    def write(self, b):
        data = bytes(b)
        n = len(data)
        start = self.pos - self.taken
        if start < 0:  # rewriting bytes already sent
            data, start = data[-start:], 0
        if data:
            if start > len(self.pending):
                self.pending.extend(bytes(start - len(self.pending)))
            self.pending[start:start + len(data)] = data
        self.pos += n
        return n

    def take(self) -> bytes:
        out = bytes(self.pending)
        self.taken += len(out)
        self.pending.clear()
        return out


class StreamEncoder:
    """Encode chunks of float32 mono audio as they come: ``feed(chunk) -> bytes``, ``close() -> bytes``."""

    def __init__(self, fmt: Format, sample_rate: int):
        self.fmt, self._sink, self._first = fmt, _Sink(), fmt.name == "wav"
        self._file = sf.SoundFile(self._sink, "w", sample_rate, 1, fmt.subtype, format=fmt.container)

    def _taken(self) -> bytes:
        out = self._sink.take()
        if self._first and out:  # RIFF and data sizes: unknown while streaming
            out = bytearray(out)
            riff = out.find(b"RIFF")
            data = out.find(b"data")
            if riff != 0 or data < 0 or len(out) < data + 8:
                raise AssertionError("libsndfile's wav header is not where expected")
            struct.pack_into("<I", out, 4, WAV_UNKNOWN_SIZE)
            struct.pack_into("<I", out, data + 4, WAV_UNKNOWN_SIZE)
            out, self._first = bytes(out), False
        return out

    def feed(self, audio: np.ndarray) -> bytes:
        self._file.write(_clipped(audio))
        return self._taken()

    def close(self) -> bytes:
        if not self._file.closed:
            self._file.close()
        return self._taken()


def encode(audio: np.ndarray, sample_rate: int, fmt: Format) -> bytes:
    """The whole clip as one file of ``fmt``."""
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", sample_rate, 1, fmt.subtype, format=fmt.container) as f:
        f.write(_clipped(audio))
    return buf.getvalue()
