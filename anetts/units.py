"""Human-readable quantities for reports: the one byte formatter (report, publish card, inspect CLI)
and the one count formatter (multiply-accumulates: inspect CLI, report)."""
from __future__ import annotations


def format_bytes(n: int | float | None) -> str:
    """`n` bytes in binary units (1024-based, so KiB / MiB / GiB): `512 B`, `3.7 MiB`; `—` for None."""
    if n is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable: GiB ends the loop")


def format_count(n: int | float | None) -> str:
    """A count in decimal (SI) units, 3 significant digits: `950`, `3.70 M`, `1.25 G`, `12.0 T`; `—` for None."""
    if n is None:
        return "—"
    if abs(n) < 1000:
        return f"{n:.0f}"
    for unit in ("k", "M", "G", "T"):
        n /= 1000
        if abs(float(f"{n:.3g}")) < 1000 or unit == "T":
            digits = 2 if abs(n) < 9.995 else 1 if abs(n) < 99.95 else 0
            return f"{n:.{digits}f} {unit}"
    raise AssertionError("unreachable: T ends the loop")
