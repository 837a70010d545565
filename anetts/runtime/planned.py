"""What a runtime's ``stream`` returns: the chunks still to make, and how much work they were planned as.

``stream`` plans before it returns (text -> chunks, each chunk's size checked), so a caller knows the
work ahead before the first chunk costs anything: Kokoro counts phonemes, Fish frames of budget. The
server refuses a request whose planned work cannot fit its timeout at the speed it has measured.
"""
from __future__ import annotations

from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


class Planned(Generic[T]):
    """An iterator of chunks that carries ``units`` (the planned work) and ``unit`` (what it counts)."""

    def __init__(self, chunks: Iterator[T], units: int, unit: str):
        self._chunks, self.units, self.unit = chunks, int(units), unit

    def __iter__(self) -> "Planned[T]":
        return self

    def __next__(self) -> T:
        return next(self._chunks)
