"""The server's settings and every limit it puts on what clients send, in one place (the CLI's defaults,
the app's checks and README's table of limits read them from here; a test holds the README to them).
Importing this module imports no web framework."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from anetts.models.kokoro.blend import MAX_SPEC_CHARS, MAX_TERMS

MAX_INPUT_CHARS = 4096  # OpenAI's limit on `input`
MAX_VOICE_CHARS = MAX_SPEC_CHARS  # a voice name, id or blend
MAX_BLEND_TERMS = MAX_TERMS  # voices in one blend
MAX_NAME_CHARS = 128  # model names, response formats, registered voice names
MAX_INSTRUCTIONS_CHARS = 4096  # OpenAI's limit; ignored by both families
MAX_TRANSCRIPT_CHARS = 2000  # a reference clip's transcript; the prompt budget is checked on top
MAX_BODY_BYTES = 16 << 20  # a 30 s reference clip as 44.1 kHz float wav is ~5 MB
TIMEOUT_S = 120.0  # per request, waiting included
QUEUE = 8  # requests that may wait for a worker; more get 429
HEADER_TIMEOUT_S = 10.0  # to send a request's head, from its first byte
MAX_VOICES = 20  # cloned voices per owner (an API key; the one user of a server without keys): OpenAI's
MAX_VOICE_BYTES = 256 << 20  # the voice store, all owners (a 30 s reference is ~30 KB of codes)
MAX_REFERENCES = 1  # inline references in one speech request


@dataclass
class ServeConfig:
    model_dir: Path
    backend: str | None = None
    workers: int = 1
    queue: int = QUEUE
    timeout: float = TIMEOUT_S
    api_keys: tuple[str, ...] = ()  # guard.read_keys: a file or $ANETTS_API_KEY, never argv
    host: str = "127.0.0.1"  # the address bound: loopback admits only loopback Host names
    allowed_hosts: list[str] = field(default_factory=list)  # more Host names to answer to
    cors_origins: list[str] = field(default_factory=list)
    max_body_bytes: int = MAX_BODY_BYTES
    max_input_chars: int = MAX_INPUT_CHARS
    max_frames: int | None = None  # Fish: most frames per text chunk
    threads: int | None = None
    header_timeout: float = HEADER_TIMEOUT_S
    voice_dir: Path | None = None  # where cloned voices are kept (anetts.serve.voices); None: in memory
    max_voices: int = MAX_VOICES
    max_voice_bytes: int = MAX_VOICE_BYTES
    prefix_cache_mb: int | None = None  # Fish: MiB of prefilled voice prompts, the workers' one cache; None: the runtime's default
