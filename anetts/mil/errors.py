"""Exceptions raised by the MIL reference executor."""
from __future__ import annotations

from collections.abc import Iterable


class MilError(Exception):
    """Base class of every error the executor raises on purpose."""


class MilLoadError(MilError):
    """The package could not be read or its program is malformed."""


class UnsupportedOpError(MilLoadError):
    """The program uses op types (or op attributes) this executor does not implement.

    Raised at load time, after scanning *every* op of every function, so a user learns
    about all the gaps at once instead of one per run.
    """

    def __init__(self, package: str, problems: dict[str, Iterable[str]]):
        # problems: op type (or "type: detail") -> names of the ops concerned
        self.package = str(package)
        self.problems = {k: sorted(set(v)) for k, v in problems.items()}
        self.op_types = sorted({k.split(":", 1)[0] for k in self.problems})
        lines = []
        for key in sorted(self.problems):
            names = self.problems[key]
            shown = ", ".join(names[:3]) + (f", ... ({len(names)} ops)" if len(names) > 3 else "")
            lines.append(f"  - {key}  [{shown}]")
        super().__init__(
            f"{self.package}: unsupported MIL op type(s) {', '.join(self.op_types)}:\n"
            + "\n".join(lines)
        )


class MilInputError(MilError, ValueError):
    """Inputs passed to ``MilProgram.run`` do not match the function signature."""


class MilRuntimeError(MilError):
    """An op failed while executing (bad index, shape mismatch, ...)."""
