"""Model state for stateful ML Programs (iOS18 / macOS15 ``state`` function inputs).

A state input is a named buffer that persists between calls: the program reads it with
``read_state`` and overwrites it with ``write_state`` (coremltools' ``coreml_update_state``
is serialized as ``write_state`` then ``read_state``, see its ``backend/mil/load.py``).
Core ML holds states in fp16 only and allocates them zero-filled (``MLModel.makeState()``);
:meth:`MilProgram.make_state` does the same, in the dtype the program declares.

During a run each state is bound to a :class:`StateCell`; ``write_state`` replaces the
cell's tensor (it never mutates one in place, so tensors read earlier in the run keep their
values, as ``read_state`` copies in MIL).  The cells are committed back to the
:class:`MilState` only when the whole call succeeded, so a failing call leaves the state as
it was.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np
import torch

from .dtypes import NUMPY_DTYPES, TORCH_DTYPES, to_numpy
from .errors import MilInputError, MilRuntimeError


@dataclass(frozen=True)
class MilStateSpec:
    """A function's state input: name, shape (static: Core ML has no flexible states), MIL dtype."""

    name: str
    shape: tuple[int, ...]
    mil_dtype: str

    @property
    def dtype(self) -> np.dtype:
        return NUMPY_DTYPES[self.mil_dtype]


class StateCell:
    """The value of one state while a function runs (what the state var is bound to)."""

    __slots__ = ("spec", "value")

    def __init__(self, spec: MilStateSpec, value: torch.Tensor):
        self.spec = spec
        self.value = value

    def write(self, data: torch.Tensor) -> None:
        want = TORCH_DTYPES[self.spec.mil_dtype]
        if not isinstance(data, torch.Tensor):
            raise MilRuntimeError(f"state {self.spec.name!r}: write_state data is not a tensor")
        if data.dtype != want or tuple(data.shape) != self.spec.shape:
            # MIL type inference requires data to match the wrapped type exactly
            raise MilRuntimeError(
                f"state {self.spec.name!r}: write_state data {data.dtype}{list(data.shape)} does not match "
                f"the state's {want}{list(self.spec.shape)}"
            )
        self.value = data


class MilState:
    """The states of one stateful function, kept between calls.  Make with :meth:`MilProgram.make_state`.

    ``state[name]`` / :meth:`read` give a numpy copy in the state's dtype; :meth:`write` sets a
    value (cast to the state's dtype, which rounds fp32 to fp16 as Core ML's state buffer does).
    """

    def __init__(self, specs: Iterable[MilStateSpec]):
        self.specs = {s.name: s for s in specs}
        self._values = {
            s.name: torch.zeros(s.shape, dtype=TORCH_DTYPES[s.mil_dtype]) for s in self.specs.values()
        }

    @property
    def names(self) -> list[str]:
        return list(self.specs)

    def read(self, name: str) -> np.ndarray:
        self._known(name)
        return to_numpy(self._values[name], self.specs[name].mil_dtype).copy()

    __getitem__ = read

    def write(self, name: str, value) -> None:
        spec = self._known(name)
        arr = np.asarray(value)
        if tuple(arr.shape) != spec.shape:
            raise MilInputError(f"state {name!r} has shape {spec.shape}, got {tuple(arr.shape)}")
        self._values[name] = torch.from_numpy(np.ascontiguousarray(arr.astype(spec.dtype)))

    def to_numpy(self) -> dict[str, np.ndarray]:
        return {n: self.read(n) for n in self.specs}

    def copy(self) -> "MilState":
        other = MilState(self.specs.values())
        other._values = dict(self._values)  # tensors are never mutated in place
        return other

    def _known(self, name: str) -> MilStateSpec:
        if name not in self.specs:
            raise MilInputError(f"no state {name!r}; states: {', '.join(self.specs) or 'none'}")
        return self.specs[name]

    # ------------------------------------------------------- used by MilProgram
    def cells_for(self, wanted: list[MilStateSpec], where: str) -> dict[str, StateCell]:
        """Fresh cells for a function's declared states; the state must hold exactly those.

        A multifunction package (``prefill`` / ``decode``) shares one state between functions
        when every function declares the same states."""
        got = set(self.specs)
        want = {s.name for s in wanted}
        if got != want:
            raise MilInputError(
                f"{where}: the function's states are {sorted(want)}, the state passed holds {sorted(got)}"
            )
        for s in wanted:
            mine = self.specs[s.name]
            if (mine.shape, mine.mil_dtype) != (s.shape, s.mil_dtype):
                raise MilInputError(
                    f"{where}: state {s.name!r} is {s.mil_dtype}{list(s.shape)} in the function, "
                    f"{mine.mil_dtype}{list(mine.shape)} in the state passed"
                )
        return {s.name: StateCell(s, self._values[s.name]) for s in wanted}

    def commit(self, cells: Mapping[str, StateCell]) -> None:
        for name, cell in cells.items():
            self._values[name] = cell.value

    def __repr__(self) -> str:
        inner = ", ".join(f"{s.name}: {s.mil_dtype}{list(s.shape)}" for s in self.specs.values())
        return f"MilState({inner})"


__all__ = ["MilState", "StateCell", "MilStateSpec"]
