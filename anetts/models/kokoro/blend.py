"""Voice blends: ``"jf_alpha(0.7)+jm_kumo(0.3)"`` -> [(name, weight)], weights normalized to sum 1.

The syntax users know from Kokoro-FastAPI: names joined by ``+``, each with an optional positive
weight in parentheses (default 1). A plain name is a blend of one.
"""
from __future__ import annotations

import math
import re

from anetts.runtime.errors import InputError

_TERM = re.compile(r"(?P<name>[^()+\s]+)(?:\((?P<weight>[^()]*)\))?")


def parse_blend(spec: str) -> list[tuple[str, float]]:
    """Names and normalized weights of a voice spec; raises InputError naming the bad term."""
    terms = []
    for raw in spec.split("+"):
        term = raw.strip()
        m = _TERM.fullmatch(term)
        if m is None:
            raise InputError(f"voice {spec!r}: cannot read the term {term!r}; write name or name(weight), "
                             f"joined by '+', e.g. 'af_heart(0.7)+am_adam(0.3)'")
        weight = m["weight"]
        try:
            w = 1.0 if weight is None else float(weight)
        except ValueError:
            w = math.nan
        if not math.isfinite(w) or w <= 0:
            raise InputError(f"voice {spec!r}: the weight of {m['name']!r} must be a positive number, got {weight!r}")
        terms.append((m["name"], w))
    names = [n for n, _ in terms]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InputError(f"voice {spec!r}: {twice} named more than once; give each voice one weight")
    total = sum(w for _, w in terms)
    return [(n, w / total) for n, w in terms]
