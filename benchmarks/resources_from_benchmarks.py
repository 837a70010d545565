"""Derive anetts/resources_table.json (what every rule declares) from a build's benchmark files.

After a build (`snakemake all --config model=M`) in WORKDIR, each job has left
artifacts/M/benchmarks/<rule>/<wildcards>.tsv (wall seconds, peak RSS, CPU seconds). This
script turns them into one measured point per job: the job's size (bucket size, a stage's summed
bucket sizes, or the package count: anetts.resources.RULES says which), its seconds, peak RSS
and output size (from Snakemake's per-output metadata, which names each output's job and inputs),
and writes them as the model's entry of the table, keeping every other entry.

    snakemake all -c2 --config model=kokoro-82m job_server=False
    python benchmarks/resources_from_benchmarks.py --workdir . --model kokoro-82m

"seconds" is min(wall, CPU seconds): on a loaded machine the wall time counts other jobs' turns,
on an idle one a multi-threaded job's wall is below its CPU time; either way it approximates the
job's time on a machine of its own.
"""
from __future__ import annotations

import argparse
import base64
import csv
import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from anetts import artifacts  # noqa: E402
from anetts.resources import ACTIONLESS_RULES, MIB, RULES, TABLE_PATH, RuleResources, ResourceError  # noqa: E402
from anetts.workflow import WorkflowConfig  # noqa: E402


def job_key(path: Path, base: Path, suffix: str) -> tuple[str, dict]:
    """(rule, wildcards) of a benchmark or log file: <base>/<rule>/<w1>/<w2><suffix>."""
    rel = path.relative_to(base)
    parts = list(rel.with_name(rel.name[: -len(suffix)]).parts)
    rule, values = parts[0], parts[1:]
    if rule not in RULES:
        raise ResourceError(f"{path}: rule {rule!r} is not in anetts.resources.RULES")
    names = RULES[rule].wildcards
    if len(values) != len(names):
        raise ResourceError(f"{path}: rule {rule} expects wildcards {names} in the path, got {values}")
    return rule, dict(zip(names, values))


def read_benchmark(tsv: Path) -> dict:
    if artifacts.job_usage(tsv).exists():
        # the declarations are for jobs in their own process (cluster executors run them so); a job
        # forked from the job server skipped the imports, and Snakemake sampled only its client
        raise ResourceError(f"{tsv}: the job ran in the build's job server; measure a build made with "
                            f"--config job_server=False")
    with open(tsv) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows:
        raise ResourceError(f"{tsv}: no benchmark row")
    worst = {}
    for row in rows:  # repeat("…", n) writes n rows: keep the worst
        if row["max_rss"] in ("NA", "-", ""):
            raise ResourceError(f"{tsv}: no peak RSS recorded (job shorter than the first sample?)")
        wall, cpu, rss = float(row["s"]), float(row["cpu_time"]), float(row["max_rss"])
        worst = {"wall_s": max(wall, worst.get("wall_s", 0)), "cpu_s": max(cpu, worst.get("cpu_s", 0)),
                 "max_rss_mib": max(rss, worst.get("max_rss_mib", 0))}
    return worst




def job_io(workdir: Path, model: str) -> dict:
    """(rule, wildcards) -> {"out_mib", "in_mib"} from .snakemake/metadata (one record per output)."""
    meta = workdir / ".snakemake" / "metadata"
    logs = artifacts.model_dir(model, workdir / artifacts.ARTIFACTS) / "logs"
    jobs: dict[tuple, dict] = {}
    for rec_file in sorted(meta.rglob("*")) if meta.is_dir() else []:
        if not rec_file.is_file():
            continue
        try:  # long names are split into folders of 255 characters
            output = base64.urlsafe_b64decode("".join(rec_file.relative_to(meta).parts).encode()).decode()
            rec = json.loads(rec_file.read_text())
        except (ValueError, UnicodeDecodeError):
            continue
        log = next((workdir / p for p in rec.get("log") or [] if (workdir / p).is_relative_to(logs)), None)
        if log is None or not (workdir / output).exists():
            continue
        rule, wildcards = job_key(log, logs, ".log")
        key = (rule, tuple(sorted(wildcards.items())))
        job = jobs.setdefault(key, {"out": 0, "inputs": set()})
        job["out"] += artifacts.tree_bytes(workdir / output)
        job["inputs"].update(rec.get("input") or [])
    return {k: {"out_mib": round(j["out"] / MIB, 3),
                "in_mib": round(sum(artifacts.tree_bytes(workdir / p) for p in j["inputs"] if (workdir / p).exists()) / MIB, 3)}
            for k, j in jobs.items()}


def measure(workdir: Path, model: str) -> tuple[dict, list[str]]:
    """The model's table entry {rule: {stage or "*": [point, ...]}} and the rules without benchmarks."""
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    wf = WorkflowConfig(config, root=workdir)
    sizes = RuleResources(wf, table={"models": {}})
    bench_dir = artifacts.model_dir(model, workdir / artifacts.ARTIFACTS) / "benchmarks"
    if not bench_dir.is_dir():
        raise ResourceError(f"{bench_dir}: no benchmark files; build model {model} in {workdir} first")
    io = job_io(workdir, model)
    entry: dict[str, dict[str, list]] = {}
    for tsv in sorted(bench_dir.rglob("*.tsv")):
        rule, wildcards = job_key(tsv, bench_dir, ".tsv")
        b = read_benchmark(tsv)
        stage = wildcards.get("stage")
        point = {"job": "/".join(wildcards.values()) or model,
                 "x": sizes.size(rule, model, stage, wildcards.get("bucket")),
                 "s": round(min(b["wall_s"], max(b["cpu_s"], 1.0)), 2), "wall_s": b["wall_s"], "cpu_s": b["cpu_s"],
                 "max_rss_mib": b["max_rss_mib"]}
        job = io.get((rule, tuple(sorted(wildcards.items()))))
        if job is not None:
            point["out_mib"] = job["out_mib"]
            point["in_mib"] = job["in_mib"]
            if job["in_mib"] >= 1:  # below that the inputs are code files, not data
                point["out_per_in"] = round(job["out_mib"] / job["in_mib"], 4)
        entry.setdefault(rule, {}).setdefault(stage or "*", []).append(point)
    missing = sorted(set(RULES) - set(entry) - set(ACTIONLESS_RULES))
    return entry, missing


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path("."), help="where the build ran (has config.yaml, artifacts/)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--table", type=Path, default=TABLE_PATH, help="table to update (default: %(default)s)")
    ap.add_argument("-o", "--output", type=Path, help="write here instead of updating --table in place")
    ap.add_argument("--allow-missing", action="store_true",
                    help="write even if some rules or stages have no benchmark (their old entries are kept)")
    args = ap.parse_args(argv)

    try:
        entry, missing = measure(args.workdir, args.model)
    except ResourceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    table = json.loads(args.table.read_text()) if args.table.exists() else {"models": {}}
    old = table["models"].get(args.model, {})
    if missing and not args.allow_missing:
        print(f"error: no benchmark files for rules {missing} of {args.model}; finish the build, "
              f"or pass --allow-missing to keep their old entries", file=sys.stderr)
        return 2
    # keep the entry's own keys (ceiling, io_from) and, with --allow-missing, unmeasured rules and
    # the stages of a measured rule that this build did not run (a partial build of a large model)
    kept = {k: v for k, v in old.items() if k not in RULES or k in missing}
    if args.allow_missing:
        entry = {rule: {**{st: pts for st, pts in old.get(rule, {}).items() if st not in stages}, **stages}
                 for rule, stages in entry.items()}
    table["models"][args.model] = {**kept, **entry}
    table.setdefault("measured", {})[args.model] = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "command": f"benchmarks/resources_from_benchmarks.py --model {args.model}",
        "jobs": sum(len(p) for st in entry.values() for p in st.values())}
    out = args.output or args.table
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, out)
    print(f"{out}: {args.model}, {table['measured'][args.model]['jobs']} jobs")
    for rule, stages in sorted(entry.items()):
        for stage, pts in sorted(stages.items()):
            worst = max(pts, key=lambda p: p["max_rss_mib"])
            print(f"  {rule:15s} {stage:12s} n={len(pts)}  max {max(p['s'] for p in pts):7.1f} s  "
                  f"{worst['max_rss_mib']:7.0f} MiB RSS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
