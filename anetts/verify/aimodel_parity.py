"""Parity of one Core AI asset: Apple's runtime vs the export job's eager fp32 outputs, gated.

The second parity backend beside the MIL executor: `anetts.verify.parity.run_parity` itself (the
same export call, valid regions, scoring and gates) with the ``coreai`` runner, whose program is
the Core AI conversion and whose executor is Apple's (its Linux CPU runtime here, the OS runtime on
macOS).
"""
from __future__ import annotations

import json
from pathlib import Path

from anetts.verify.parity import Gate, read_export_report, run_parity


def run_aimodel_parity(asset: Path, scenario: Path, export_report: Path, gate: Gate,
                       asset_report: Path | None = None) -> dict:
    """A `run_parity` report with the `coreai` backend (and the asset's precision); `check_parity` gates it."""
    from anetts.compile.bundle import function_name

    spec, _, _ = read_export_report(export_report)
    report = run_parity(asset, scenario, export_report, gate,
                        function_name=function_name(spec.bucket), executor="coreai")
    precision = json.loads(Path(asset_report).read_text())["precision"] if asset_report is not None else None
    report["backends"]["coreai"]["precision"] = precision
    return {**report, "asset": Path(asset).name}
