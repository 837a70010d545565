"""Human-readable quantities for reports: the one byte formatter (report, publish card, inspect CLI)."""
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
