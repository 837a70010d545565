"""The sentences a listener gate hears, per language: ``corpus/<language>.txt``, one sentence a line,
tagged with its set (``prose``, ``numbers``, ``names``: the sets peers report ASR round trips on)."""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True)
class Sentence:
    language: str  # the corpus's name: en, ja
    set: str  # prose, numbers, names
    index: int  # line within the language's corpus, from 0
    text: str


def languages() -> list[str]:
    return sorted(p.name[:-4] for p in resources.files("anetts.listen").joinpath("corpus").iterdir()
                  if p.name.endswith(".txt"))


def sentences(language: str, limit: int | None = None) -> list[Sentence]:
    """The corpus of ``language`` (the first ``limit`` of each set when given)."""
    path = resources.files("anetts.listen").joinpath("corpus", f"{language}.txt")
    if not path.is_file():
        raise ValueError(f"no listening corpus for language {language!r}; have {languages()}")
    out, per_set, index = [], {}, 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        tag, sep, text = line.partition("\t")
        if not sep or not text.strip():
            raise ValueError(f"{path}: {line[:40]!r} is not '<set>\\t<sentence>'")
        per_set[tag] = per_set.get(tag, 0) + 1
        if limit is None or per_set[tag] <= limit:
            out.append(Sentence(language, tag, index, text.strip()))
        index += 1
    return out
