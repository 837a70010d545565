"""Publishing errors; each message names the file, package or endpoint at fault.

Kept apart from the runtime's errors so ``anetts publish`` does not import the runtime (and torch).
"""
from __future__ import annotations


class PublishError(RuntimeError):
    """A tree that may not be published (failed gate, unverified file) or a Hub that refused it."""
