"""Publishing errors; each message names the file, package or endpoint at fault.

Kept apart from the runtime's errors: a publishing failure is not a runtime one (the manifest reader
``anetts publish`` shares with the runtime, :func:`anetts.runtime.manifest.manifest_paths`, imports no torch).
"""
from __future__ import annotations


class PublishError(RuntimeError):
    """A tree that may not be published (failed gate, unverified file) or a Hub that refused it."""
