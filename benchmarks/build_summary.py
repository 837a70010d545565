"""One JSON for a finished `snakemake all` of one model: per job and per rule wall, CPU and peak RSS
(Snakemake's `benchmark:` files), totals, disk used, and every package's size and largest file
against the per-file limits.

    /usr/bin/time -v snakemake all --cores 2 --config model=fish-s2-pro job_server=False > run.log 2>&1
    python benchmarks/build_summary.py --model fish-s2-pro --run-log run.log \
        --command "snakemake all --cores 2 --config model=fish-s2-pro job_server=False" -o OUT.json

Build with `job_server=False`: a warm job's benchmark file has the client's CPU and RSS, not the job's
(docs/startup.md, "The job server"). `--run-log` adds what `/usr/bin/time -v` printed for the whole run (its
wall time, and the largest peak RSS of any one process of it), once per run of a resumed build. A job that ran in an earlier run of the
same build keeps its own benchmark file, so the per-job figures hold for a build resumed after a stop.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_benchmark import job_table  # noqa: E402
from anetts.artifacts import tree_bytes  # noqa: E402
from rule_sums import emit, rule_sums  # noqa: E402

from anetts import artifacts  # noqa: E402
from anetts.provenance import provenance  # noqa: E402

IOS_FILE_MB = 1000  # the per-file size iOS loads (docs/fish-stages.md, "Package size"); macOS: max_package_mb
MB = 1e6


def time_v(log: Path) -> dict:
    """The whole run's figures from `/usr/bin/time -v` at the end of its log."""
    text = log.read_text(errors="replace")
    out = {}
    m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", text)
    if m:
        parts = [float(p) for p in m.group(1).split(":")]
        out["wall_s"] = round(sum(p * 60 ** i for i, p in enumerate(reversed(parts))), 1)
    for key, pattern in (("user_s", r"User time \(seconds\): (\S+)"), ("system_s", r"System time \(seconds\): (\S+)"),
                         ("max_rss_mib", r"Maximum resident set size \(kbytes\): (\d+)"),
                         ("exit_status", r"Exit status: (\d+)")):
        m = re.search(pattern, text)
        if m:
            out[key] = float(m.group(1)) / (1024 if key == "max_rss_mib" else 1)
    return out


def package_sizes(model_dir: Path, limits_mb: dict[str, float]) -> list[dict]:
    rows = []
    for pkg in sorted((model_dir / "packages").glob("*/*.mlpackage")) + sorted((model_dir / "bundles").glob("*.mlpackage")):
        files = [f for f in pkg.rglob("*") if f.is_file()]
        largest = max(files, key=lambda f: f.stat().st_size)
        stage = pkg.parent.name if pkg.parent.name != "bundles" else pkg.stem
        limit = limits_mb.get(stage)
        big = largest.stat().st_size / MB
        rows.append({"package": pkg.relative_to(model_dir).as_posix(), "mb": round(tree_bytes(pkg) / MB, 1),
                     "largest_file": largest.relative_to(pkg).as_posix(), "largest_file_mb": round(big, 1),
                     "max_package_mb": limit, "under_max_package_mb": None if limit is None else big <= limit,
                     "under_ios_file_mb": big <= IOS_FILE_MB})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--workdir", type=Path, default=REPO)
    ap.add_argument("--run-log", type=Path, action="append", default=[],
                    help="a run's output, ending with /usr/bin/time -v's report (repeatable: a build resumed "
                         "over several runs)")
    ap.add_argument("--command", action="append", default=[],
                    help="a command that ran the build (recorded as given; repeatable, in the runs' order)")
    ap.add_argument("--note", action="append", default=[], help="a line recorded with the figures (repeatable)")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args(argv)

    import yaml

    from anetts.workflow import WorkflowConfig

    wf = WorkflowConfig(yaml.safe_load((args.workdir / "config.yaml").read_text()), root=args.workdir)
    model_dir = args.workdir / artifacts.ARTIFACTS / args.model
    bench = model_dir / "benchmarks"
    jobs = job_table(bench)
    limits = {s: wf.convert_options(args.model, s)["max_package_mb"] for s in wf.stages(args.model)}
    result = {
        "model": args.model,
        "commands": args.command,
        "notes": args.note,
        "machine": provenance(),
        "jobs": jobs,
        "rules": rule_sums(bench),
        "total": {"jobs": len(jobs), "job_wall_s": round(sum(j["seconds"] for j in jobs), 1),
                  "job_cpu_s": round(sum(j["cpu_seconds"] for j in jobs), 1),
                  "max_job_rss_mb": max((j["max_rss_mb"] for j in jobs), default=None)},
        "runs": [{"log": log.name, **time_v(log)} for log in args.run_log],
        "disk_mb": {p.name: round(tree_bytes(p) / MB, 1) for p in sorted(model_dir.iterdir())},
        "packages": package_sizes(model_dir, limits),
    }
    result["disk_mb"]["total"] = round(sum(result["disk_mb"].values()), 1)
    emit(result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
