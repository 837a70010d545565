"""Per-rule sums of a build's Snakemake `benchmark:` files: jobs, wall seconds, CPU seconds, peak RSS.

    python benchmarks/rule_sums.py artifacts/kokoro-tiny/benchmarks [--vs OTHER/benchmarks] [-o sums.json]

With --vs, each rule also gets the other build's figures (per job, since a partial build has fewer
jobs) and the per-job CPU ratio. Snakemake samples a job's CPU time, so very short jobs read low.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_benchmark import job_table  # noqa: E402


def rule_sums(bench_dir: Path) -> dict[str, dict]:
    sums: dict[str, dict] = defaultdict(lambda: {"jobs": 0, "wall_s": 0.0, "cpu_s": 0.0, "max_rss_mb": 0.0})
    for job in job_table(Path(bench_dir)):
        s = sums[job["job"].split("/")[0]]
        s["jobs"] += 1
        s["wall_s"] += job["seconds"]
        s["cpu_s"] += job["cpu_seconds"]
        s["max_rss_mb"] = max(s["max_rss_mb"], job["max_rss_mb"])
    return {rule: {k: round(v, 1) for k, v in s.items()} for rule, s in sorted(sums.items())}


def emit(result: dict, output: Path | None) -> None:
    """A benchmark's JSON on stdout and, with an output path, in that file."""
    text = json.dumps(result, indent=2) + "\n"
    if output:
        output.write_text(text)
    print(text, end="")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("benchmarks", type=Path)
    ap.add_argument("--vs", type=Path, help="another build's benchmarks folder (the baseline)")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args(argv)
    result = {"rules": rule_sums(args.benchmarks)}
    if args.vs:
        base = rule_sums(args.vs)
        for rule, s in result["rules"].items():
            if rule in base:
                b = base[rule]
                s["vs"] = b
                s["cpu_per_job_ratio"] = round((s["cpu_s"] / s["jobs"]) / (b["cpu_s"] / b["jobs"]), 3) if b["cpu_s"] else None
    for key in ("jobs", "wall_s", "cpu_s"):
        result[f"total_{key}"] = round(sum(s[key] for s in result["rules"].values()), 1)
    emit(result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
