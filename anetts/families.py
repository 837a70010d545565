"""Registry of model families. Adding a family = adding a folder under anetts/models/ and a line here.

`declaration(name)` is torch-free (what the Snakefile reads); `get_family(name)` imports the
implementation (stage wrappers, upstream code) and is for the jobs that run it.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from anetts.family import FamilyDecl

if TYPE_CHECKING:
    from anetts.stage import Family

# family name -> module holding its torch-free DECLARATION
_FAMILIES = {"kokoro": "anetts.models.kokoro.family", "fish": "anetts.models.fish.family"}


def family_names() -> list[str]:
    return sorted(_FAMILIES)


def declaration(name: str) -> FamilyDecl:
    if name not in _FAMILIES:
        raise KeyError(f"unknown model family {name!r}; known: {family_names()}")
    return importlib.import_module(_FAMILIES[name]).DECLARATION


def get_family(name: str) -> "Family":
    return importlib.import_module(declaration(name).implementation).FAMILY
