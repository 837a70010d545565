"""Voice blends: ``"jf_alpha(0.7)+jm_kumo(0.3)"`` -> [(name, weight)], weights normalized to sum 1.

The syntax users know from Kokoro-FastAPI: names joined by ``+``, each with an optional positive
weight in parentheses (default 1). A plain name is a blend of one.

A spec comes from clients (the server's ``voice``), so reading it is linear in its length and
bounded: at most ``MAX_SPEC_CHARS`` characters and ``MAX_TERMS`` terms, and an error quotes at most
``ECHO_CHARS`` of it.
"""
from __future__ import annotations

import math
import re

from anetts.runtime.errors import InputError

MAX_SPEC_CHARS = 512
MAX_TERMS = 16
ECHO_CHARS = 80

_TERM = re.compile(r"(?P<name>[^()+\s]+)(?:\((?P<weight>[^()]*)\))?")


def echo(spec: str, limit: int = ECHO_CHARS) -> str:
    """``spec`` quoted for an error message, cut to ``limit`` characters."""
    if len(spec) <= limit:
        return repr(spec)
    return f"{spec[:limit]!r}... ({len(spec)} characters)"


def parse_blend(spec: str) -> list[tuple[str, float]]:
    """Names and normalized weights of a voice spec; raises InputError naming the bad term."""
    if len(spec) > MAX_SPEC_CHARS:
        raise InputError(f"voice {echo(spec)} is longer than {MAX_SPEC_CHARS} characters")
    raw_terms = spec.split("+", MAX_TERMS)
    if len(raw_terms) > MAX_TERMS:
        raise InputError(f"voice {echo(spec)} blends more than {MAX_TERMS} voices")
    terms: list[tuple[str, float]] = []
    seen: set[str] = set()
    for raw in raw_terms:
        term = raw.strip()
        m = _TERM.fullmatch(term)
        if m is None:
            raise InputError(f"voice {echo(spec)}: cannot read the term {echo(term, 40)}; write name or "
                             f"name(weight), joined by '+', e.g. 'af_heart(0.7)+am_adam(0.3)'")
        name, weight = m["name"], m["weight"]
        try:
            w = 1.0 if weight is None else float(weight)
        except ValueError:
            w = math.nan
        if not math.isfinite(w) or w <= 0:
            raise InputError(f"voice {echo(spec)}: the weight of {echo(name, 40)} must be a positive number, "
                             f"got {echo(weight, 40)}")
        if name in seen:
            raise InputError(f"voice {echo(spec)}: {echo(name, 40)} is named more than once; give each voice "
                             "one weight")
        seen.add(name)
        terms.append((name, w))
    # scaled by the largest first, so weights near the float limit (1e308 + 1e308) cannot overflow the sum
    top = max(w for _, w in terms)
    scaled = [(n, w / top) for n, w in terms]
    total = math.fsum(w for _, w in scaled)
    return [(n, w / total) for n, w in scaled]
