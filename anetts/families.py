"""Registry of model families. Adding a family = adding a module here, not editing machinery."""
from __future__ import annotations

import importlib

from anetts.stage import Family

_FAMILIES = {"kokoro": "anetts.models.kokoro"}


def family_names() -> list[str]:
    return sorted(_FAMILIES)


def get_family(name: str) -> Family:
    if name not in _FAMILIES:
        raise KeyError(f"unknown model family {name!r}; known: {family_names()}")
    return importlib.import_module(_FAMILIES[name]).FAMILY
