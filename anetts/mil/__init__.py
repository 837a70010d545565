"""MIL reference executor: run the ML Program of an .mlpackage on Linux with torch.

Usage::

    from anetts.mil import load_program
    prog = load_program("model.mlpackage")
    outputs = prog.run({"x": x})          # dict name -> numpy array (declared dtypes)

See :mod:`anetts.mil.program` for the precision policy and :mod:`anetts.mil.cli` for
the ``run-mil`` command.
"""
from .errors import MilError, MilInputError, MilLoadError, MilRuntimeError, UnsupportedOpError
from .program import InputSpec, MilProgram, load_program, program_from_spec
from .registry import supported_ops

__all__ = [
    "InputSpec",
    "MilError",
    "MilInputError",
    "MilLoadError",
    "MilProgram",
    "MilRuntimeError",
    "UnsupportedOpError",
    "load_program",
    "program_from_spec",
    "supported_ops",
]
