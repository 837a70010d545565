"""Error types of the runtime: every failure a user can cause or meet names its cause.

The CLI catches :class:`TTSError` (and only it) to print a one-line message and exit non-zero.
"""
from __future__ import annotations


class TTSError(Exception):
    """Base of every error the runtime raises on purpose."""


class InputError(TTSError, ValueError):
    """Bad user input: empty text, nothing speakable, bad speed, unknown voice, ..."""


class ArtifactError(TTSError):
    """A model directory that cannot be used: missing/invalid manifest, missing package, ..."""


class IntegrityError(ArtifactError):
    """A package (or TorchScript) whose sha256 does not match the manifest."""


class FrontendUnavailable(TTSError, RuntimeError):
    """A language's G2P cannot run here (a package or dictionary is missing); says how to install it."""


class BackendUnavailable(TTSError, RuntimeError):
    """The chosen backend cannot run here (wrong platform, missing module)."""
