"""Error types of the runtime: every failure a user can cause or meet names its cause.

The CLI catches :class:`TTSError` (and only it) to print a one-line message and exit non-zero.
"""
from __future__ import annotations

import numbers


class TTSError(Exception):
    """Base of every error the runtime raises on purpose."""


class InputError(TTSError, ValueError):
    """Bad user input: empty text, nothing speakable, bad speed, unknown voice, ...

    ``field`` names the input at fault where the raiser knows it better than its caller (a reference
    clip's transcript against its audio); the server reports it as the error's ``param``."""

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


def validate_seed(seed) -> int:
    """A seed numpy's generators take (a non-negative integer), else an InputError naming it."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def check_text_unicode(text: str, what: str = "text") -> None:
    """An InputError naming the first lone surrogate in ``text`` by its position (JSON's ``\\ud800``
    escapes decode to one; no encoder or G2P can take it, and theirs would name a position in a piece)."""
    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            raise InputError(f"{what} has a lone surrogate (U+{ord(ch):04X}) at position {i}: not a character; "
                             "send valid Unicode", field=what)


class ArtifactError(TTSError):
    """A model directory that cannot be used: missing/invalid manifest, missing package, ..."""


class IntegrityError(ArtifactError):
    """A package (or TorchScript) whose sha256 does not match the manifest."""


class FrontendUnavailable(TTSError, RuntimeError):
    """A language's G2P cannot run here (a package or dictionary is missing); says how to install it."""


class BackendUnavailable(TTSError, RuntimeError):
    """The chosen backend cannot run here (wrong platform, missing module)."""
