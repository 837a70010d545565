"""Which compute units each stage runs fastest on, measured on a Mac: the ``placement`` record of an
``anetts bench --placement`` JSON, and the runtime's use of it.

``anetts bench --placement`` (macOS, Core ML) times every stage's largest bucket under each of
:data:`CANDIDATES`, records Core ML's compute plan for each (device per op), and chooses the faster.
The record lives in the bench JSON (``<model_dir>/bench/*.json``, sent back from a Mac like any
other), so the report shows it and publishing carries it. A Core ML runtime loaded on the same chip,
with no compute units given, runs each stage on the units its newest record chose.

Schema (``placement`` of a bench JSON)::

    {"schema": 1, "iterations": N,
     "stages": {STAGE: {"bucket": B, "chosen": UNITS,
                        "units": {UNITS: {"median_s": s, "plan": {"by_device": {...}, "ane_op_fraction": f} | null}}}}}
"""
from __future__ import annotations

import json
import logging
import platform
import subprocess
import sys
from pathlib import Path

from anetts import artifacts

log = logging.getLogger(__name__)

PLACEMENT_SCHEMA = 1
CANDIDATES = ("CPU_AND_NE", "CPU_AND_GPU")


class PlacementError(ValueError):
    """A placement record that does not hold what the schema says; names the file and the key."""


def chip_name() -> str:
    """The processor as a person would name it: `Apple M2 Pro` on a Mac, the CPU model elsewhere."""
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                 check=True, timeout=10).stdout.strip()
            if out:
                return out
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def check_placement(data, where: str) -> dict:
    """``data`` as the schema says, else a PlacementError naming ``where`` and the key."""
    if not isinstance(data, dict) or data.get("schema") != PLACEMENT_SCHEMA:
        raise PlacementError(f"{where}: placement.schema must be {PLACEMENT_SCHEMA}")
    stages = data.get("stages")
    if not isinstance(stages, dict) or not stages:
        raise PlacementError(f"{where}: placement.stages must be a non-empty object")
    for stage, s in stages.items():
        at = f"{where}: placement.stages.{stage}"
        if not isinstance(s, dict) or not isinstance(s.get("units"), dict) or not s["units"]:
            raise PlacementError(f"{at}.units must be a non-empty object")
        if s.get("chosen") not in s["units"]:
            raise PlacementError(f"{at}.chosen ({s.get('chosen')!r}) must be one of the units it timed: {list(s['units'])}")
        for units, u in s["units"].items():
            if units not in CANDIDATES:
                raise PlacementError(f"{at}.units: {units!r} is not one of {list(CANDIDATES)}")
            t = u.get("median_s") if isinstance(u, dict) else None
            if not isinstance(t, (int, float)) or not t > 0:
                raise PlacementError(f"{at}.units.{units}.median_s must be a positive number, got {t!r}")
    return data


def placement_records(model_dir: str | Path) -> list[dict]:
    """Every bench JSON of ``model_dir`` that holds a placement, oldest first: {"file", "chip",
    "created_utc", "placement"}. One that cannot be read, or whose placement breaks the schema, is
    skipped with a warning naming it."""
    model_dir = Path(model_dir)
    folder = artifacts.bench_dir(model_dir.name, root=model_dir.parent)
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or data.get("placement") is None:
                continue
            check_placement(data["placement"], str(path))
        except (OSError, ValueError) as e:
            log.warning("ignoring %s: %s", path, e)
            continue
        found.append({"file": str(path), "chip": str(data.get("chip")), "created_utc": str(data.get("created_utc", "")),
                      "placement": data["placement"]})
    return sorted(found, key=lambda r: r["created_utc"])


def measured_placement(model_dir: str | Path, chip: str | None = None) -> dict | None:
    """The newest placement measured on ``chip`` (default: this machine's) for ``model_dir``:
    {"file", "chip", "created_utc", "units": {stage: chosen units}}, or None."""
    chip = chip or chip_name()
    mine = [r for r in placement_records(model_dir) if r["chip"] == chip]
    if not mine:
        return None
    r = mine[-1]
    return {"file": r["file"], "chip": chip, "created_utc": r["created_utc"],
            "units": {s: v["chosen"] for s, v in r["placement"]["stages"].items()}}
