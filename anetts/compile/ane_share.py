"""A build's ANE-eligible share (issue #41): the multiply-accumulates per second of audio that lie in
packages able to run on the Neural Engine, over all of them.

A package is *eligible* when all of these hold (`why_not` lists the ones that fail):

- its compute units are `CPU_AND_NE` (the stage's config);
- its precision is `fp16` and the lint finds no fp32 compute op in it;
- its static ANE lint (:mod:`anetts.compile.inspect`, the findings its convert report already holds:
  nothing is linted again) has no finding above `info`: no tensor axis over 16,384, no op the lint
  names ANE-hostile, no dynamic gather, no flexible shapes, no rank above 5.

A stage is eligible when every one of its buckets' packages is.

MACs per second of audio: one call of a bucket's package (`anetts.compile.macs`) over the seconds of
audio that bucket covers, which the family says (`FamilyDecl.audio_seconds`). Each stage counts at its
**largest** bucket: the convolutions' MACs grow with the length, so the frame stages' rate is the
same at every bucket to within the edges, while attention over tokens grows faster, so the largest
bucket gives a stage's highest rate; an average over buckets would weigh a 3 s bucket like a 30 s one,
which no workload does. Every bucket's rate is kept beside it (`by_bucket`).

A figure of the static program, not a measurement: only a compute plan on a Mac shows placement.
"""
from __future__ import annotations

from collections.abc import Callable

ELIGIBLE_UNITS = "CPU_AND_NE"
ELIGIBLE_PRECISION = "fp16"
# lint severities that do not cost eligibility (`info`: a hazard the lint notes, not a rule it breaks)
HARMLESS_SEVERITIES = ("info",)
DEFINITION = ("MACs per second of audio in CPU_AND_NE, fp16, lint-clean packages (no lint finding above info) "
              "over all MACs per second of audio; each stage at its largest bucket")


def undefined_share(why: str) -> dict:
    """The share of a build it is not defined for, saying why."""
    return {"definition": DEFINITION, "share": None, "undefined": why, "stages": []}


def why_not_eligible(compute_units: str | None, precision: str | None, lint: list[dict]) -> list[str]:
    """Why a package cannot count as ANE work ([] when it can): its compute units, precision, and
    every lint rule above `info` it breaks, with the finding count."""
    return list(_why_not(compute_units, precision, lint).values())


def _why_not(compute_units: str | None, precision: str | None, lint: list[dict]) -> dict[str, str]:
    """`why_not_eligible` keyed by what fails (so a stage's buckets can be merged)."""
    why = {}
    if compute_units != ELIGIBLE_UNITS:
        why["compute_units"] = f"compute units {compute_units}"
    if precision != ELIGIBLE_PRECISION:
        why["precision"] = f"precision {precision}"
    counts: dict[str, int] = {}
    for f in lint:
        if f.get("severity") not in HARMLESS_SEVERITIES:
            key = f["rule"] + (f" ({f['op_type']})" if f.get("op_type") else "")
            counts[key] = counts.get(key, 0) + int(f.get("count", 1))
    why.update({rule: f"lint {rule} x{n}" for rule, n in sorted(counts.items())})
    return why


def one_call_macs(report_macs: dict | None) -> int | None:
    """MACs of one call of a one-function package, from its convert report's `macs` ({function:
    {"total", "by_op"}}); None when the report has none (an older build) or several functions (a call
    of which is not a bucket of audio)."""
    if not report_macs or len(report_macs) != 1:
        return None
    return int(next(iter(report_macs.values()))["total"])


def ane_share(packages: list[dict], audio_seconds: Callable[[str, dict], float]) -> dict:
    """The share over `packages`: dicts with stage, bucket, geometry, compute_units, precision, lint
    and macs (one call; None when unknown). `audio_seconds(stage, geometry)`: the audio one call
    covers. A package without MACs leaves the share undefined (`share` None, `undefined` says why)."""
    missing = [f"{p['stage']}/{p['bucket']}" for p in packages if p.get("macs") is None]
    if missing or not packages:
        return undefined_share(f"no MACs of one call of {', '.join(missing)} in its package report (a compressed "
                               "variant's, an older build's, or a package of several functions)"
                               if missing else "no packages")
    by_stage: dict[str, list[dict]] = {}
    for p in packages:
        by_stage.setdefault(p["stage"], []).append(p)
    stages = []
    for stage, pkgs in by_stage.items():
        rates, reasons = {}, {}
        for p in pkgs:
            seconds = float(audio_seconds(stage, p["geometry"]))
            if not seconds > 0:
                raise ValueError(f"{stage}/{p['bucket']}: covers {seconds} s of audio")
            rates[p["bucket"]] = {"seconds": seconds, "macs": p["macs"], "macs_per_second": p["macs"] / seconds}
            reasons[p["bucket"]] = _why_not(p.get("compute_units"), p.get("precision"), p.get("lint") or [])
        bucket = max(rates, key=lambda b: rates[b]["seconds"])
        # the counted bucket's reasons, then what fails only at other buckets, naming them
        merged = dict(reasons[bucket])
        for b, why_b in reasons.items():
            for key, text in why_b.items():
                merged.setdefault(key, f"{text} (at {b})")
        why = list(merged.values())
        stages.append({"stage": stage, "bucket": bucket, "audio_seconds": rates[bucket]["seconds"],
                       "macs": rates[bucket]["macs"], "macs_per_second": rates[bucket]["macs_per_second"],
                       "eligible": not why, "why_not": why,
                       "by_bucket": {b: r["macs_per_second"] for b, r in rates.items()}})
    total = sum(s["macs_per_second"] for s in stages)
    eligible = sum(s["macs_per_second"] for s in stages if s["eligible"])
    for s in stages:
        s["share_of_total"] = s["macs_per_second"] / total if total else None
    return {"definition": DEFINITION, "bucket": "largest", "macs_per_second": total,
            "eligible_macs_per_second": eligible, "share": eligible / total if total else None, "stages": stages}
