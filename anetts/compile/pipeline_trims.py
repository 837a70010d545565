"""Work coremltools' pass pipelines do that nobody uses, left out of our conversions and bundles:
validating the MIL program after every graph pass (once per program instead), and rendering the
whole program as text for debug log lines that are not logged."""
from __future__ import annotations

import logging
from contextlib import contextmanager


@contextmanager
def validated_once():
    """coremltools' conversion with each MIL program validated once, when it is done, not after every pass.

    coremltools walks the whole program to validate it before each pass pipeline and after every
    one of its passes (PassPipelineManager.apply_pipeline), even when it runs none:
    `save_multifunction` skips all 104 of them and still validates 108 times. That was 45 % of
    converting Kokoro's generator at 3 s (19.5 -> 12.9 s with one validation) and 72 % of bundling
    its five buckets, on this project's 2-core box, with the same sha256 (benchmarks/results/startup_log.md). Inside
    the context those calls only note the program; the caller runs the yielded `validate_noted`
    when the conversion is done, which validates each noted program once, so a pass that leaves an
    invalid program still fails the conversion (naming the stage, not the pass).
    """
    from coremltools.converters.mil.mil.program import Program

    validate = Program.validate
    noted: dict[int, Program] = {}

    def note(self, check_essential_scope=False):
        noted.setdefault(id(self), self)

    def validate_noted():
        for prog in noted.values():
            validate(prog)

    Program.validate = note
    try:
        yield validate_noted
    finally:
        Program.validate = validate


@contextmanager
def program_text_skipped():
    """coremltools' pass pipelines without rendering the whole program as text for debug log lines
    that are not logged.

    `PassPipelineManager.apply_pipeline` formats `f"Program before {pipeline} pipeline:\n{prog}"`
    for `logger.debug` before and after each of its three pipelines, whatever the log level: 21 %
    of bundling Kokoro's generator (benchmarks/results/startup_log.md). Inside the context, unless coremltools'
    logger is at DEBUG, a program renders as a one-line summary.
    """
    if logging.getLogger("coremltools").isEnabledFor(logging.DEBUG):
        yield
        return
    from coremltools.converters.mil.mil.program import Program

    render = Program.__str__
    Program.__str__ = lambda self: (f"<MIL program {', '.join(self.functions)}: text not rendered, "
                                    "coremltools' logger is not at DEBUG>")
    try:
        yield
    finally:
        Program.__str__ = render
