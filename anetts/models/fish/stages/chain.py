"""Play a scenario on a compiled Fish AR stage (a package of the build, or one that
`anetts.compile.scenario_export.compile_module` made for a test or benchmark). The compiled stages are
composed by the runtime's decode loop (`runtime.FishDecoder`; over bare packages:
`chain_check.compiled_decoder`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from anetts.verify.scenario import Scenario


def play_mil(package: Path, scenario: Scenario) -> list[dict[str, np.ndarray]]:
    """Every call's outputs on the MIL executor's runner, one state carried through (run_scenario
    scores; this keeps the outputs, e.g. for top-1 agreement of logits)."""
    from anetts.models.fish.chain_check import mil_program

    program = mil_program(Path(package).stem, package)
    state = program.new_state(scenario.calls[0].function) if scenario.states else None
    return [program.run(c.function, dict(c.inputs), state) for c in scenario.calls]
