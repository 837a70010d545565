"""The compiled-chain gate (rule `chain_parity`): run the family's chain check, write its report
only if it passed, else a `.failed.json` beside it and an error naming the failed checks
(`anetts.gate.write_checks_verdict`, shared with the end-to-end gate)."""
from __future__ import annotations

import logging
from pathlib import Path

from anetts.artifacts import clear_outputs
from anetts.families import get_family
from anetts.gate import ParityError, write_checks_verdict
from anetts.options import Gate

log = logging.getLogger(__name__)


def check_chain_report(family_name: str, packages: dict, assets_dir: Path, reference: Path, gate: dict,
                       stage_params: dict, settings: dict, out_json: Path) -> dict:
    """`settings`: the model's `chain` block of the config (the family's check names its keys)."""
    out_json = Path(out_json)
    clear_outputs(out_json)
    family = get_family(family_name)
    if family.check_chain is None:
        raise ParityError(f"family {family_name!r} has no chain check")
    report = family.check_chain({k: Path(v) for k, v in packages.items()}, Path(assets_dir), Path(reference),
                                Gate.make(**gate), stage_params, dict(settings))
    if report["passed"] and not report.get("meets_target", True):
        log.warning("chain %s: passed below the %s dB target", out_json.stem, gate.get("target_snr_db"))
    return write_checks_verdict(report, out_json, f"compiled chain {out_json.stem}")

