"""MIL reference executor: run the ML Program of an .mlpackage on Linux with torch.

Usage::

    from anetts.mil import load_program
    prog = load_program("model.mlpackage")
    outputs = prog.run({"x": x})          # dict name -> numpy array (declared dtypes)
    state = prog.make_state("decode")    # stateful functions: zero-filled fp16 states
    prog.run(inputs, "decode", state=state)  # reads and updates state

See :mod:`anetts.mil.program` for the precision policy and :mod:`anetts.mil.cli` for
the ``run-mil`` command.
"""
from .errors import MilError, MilInputError, MilLoadError, MilRuntimeError, UnsupportedOpError
from .program import InputSpec, MilProgram, load_program, program_from_spec
from .registry import supported_ops
from .state import MilState, MilStateSpec

__all__ = [
    "InputSpec",
    "MilError",
    "MilInputError",
    "MilLoadError",
    "MilProgram",
    "MilRuntimeError",
    "MilState",
    "MilStateSpec",
    "UnsupportedOpError",
    "load_program",
    "program_from_spec",
    "supported_ops",
]
