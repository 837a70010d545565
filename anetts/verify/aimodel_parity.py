"""Parity of one Core AI asset: Apple's runtime vs the export's expected outputs, gated.

The second parity backend beside the MIL executor: `anetts.verify.parity.run_parity` itself (the
same scenario, valid regions, scoring and gates) with the ``coreai`` runner, whose program is the
Core AI conversion and whose executor is Apple's (its Linux CPU runtime here, the OS runtime on
macOS). The asset names its one function after the bucket (`t48`), the export `main`.
"""
from __future__ import annotations

import json
from pathlib import Path

from anetts.options import Gate
from anetts.tensors import MAIN_FUNCTION, function_name
from anetts.verify.parity import run_parity


def run_aimodel_parity(asset: Path, scenario: Path, export_report: Path, gate: Gate,
                       asset_report: Path | None = None) -> dict:
    """A `run_parity` report with the `coreai` backend (and the asset's precision); `check_parity` gates it."""
    bucket = json.loads(Path(export_report).read_text(encoding="utf-8"))["bucket"]
    report = run_parity(asset, scenario, export_report, gate, executor="coreai",
                        rename={MAIN_FUNCTION: function_name(bucket)})
    precision = json.loads(Path(asset_report).read_text())["precision"] if asset_report is not None else None
    report["backends"]["coreai"]["precision"] = precision
    return {**report, "asset": Path(asset).name}
