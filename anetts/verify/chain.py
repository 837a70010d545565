"""The compiled-chain gate (rule `chain_parity`): run the family's chain check, write its report
only if it passed, else a `.failed.json` beside it and an error naming the failed checks
(`write_verdict`, shared with the end-to-end gate)."""
from __future__ import annotations

import logging
from pathlib import Path

from anetts.artifacts import atomic_outputs, clear_outputs, write_json
from anetts.families import get_family
from anetts.options import Gate
from anetts.verify.parity import ParityError

log = logging.getLogger(__name__)


def check_chain_report(family_name: str, packages: dict, assets_dir: Path, reference: Path, gate: dict,
                       stage_params: dict, out_json: Path) -> dict:
    out_json = Path(out_json)
    clear_outputs(out_json)
    family = get_family(family_name)
    if family.check_chain is None:
        raise ParityError(f"family {family_name!r} has no chain check")
    report = family.check_chain({k: Path(v) for k, v in packages.items()}, Path(assets_dir), Path(reference),
                                Gate.make(**gate), stage_params)
    if report["passed"] and not report.get("meets_target", True):
        log.warning("chain %s: passed below the %s dB target", out_json.stem, gate.get("target_snr_db"))
    return write_verdict(report, out_json, f"compiled chain {out_json.stem}")


def write_verdict(report: dict, out_json: Path, what: str) -> dict:
    """A passed report to `out_json`; a failed one to `<stem>.failed.json` beside it, and an error
    naming its failed checks (nothing at `out_json`, so nothing downstream takes it for a pass)."""
    out_json = Path(out_json)
    failed = out_json.with_name(out_json.stem + ".failed.json")
    clear_outputs(out_json, failed)  # a pass leaves no earlier failure beside it
    if report["passed"]:
        with atomic_outputs(out_json) as (tmp,):
            write_json(tmp, report)
        return report
    write_json(failed, report)
    bad = sorted(k for k, ok in report["checks"].items() if not ok)
    raise ParityError(f"{what} failed {bad}; report: {failed}")
