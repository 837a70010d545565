"""Build benchmark: full `snakemake all`, no-op, and rebuild after editing one stage.

Runs in a scratch copy of the workflow (the checkout is never edited), then summarizes
Snakemake's per-job `benchmark:` files (wall seconds, peak RSS, CPU seconds) into one JSON.

    python benchmarks/build_benchmark.py --model kokoro-82m --cores 2 -o build_benchmark.json
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from anetts.provenance import provenance  # noqa: E402

WORKFLOW_FILES = ("Snakefile", "rules", "schemas", "workflow_scripts", "anetts", "config.yaml", "profiles")


def snakemake(workdir: Path, cores: int, *args: str) -> float:
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=str(workdir))
    subprocess.run([sys.executable, "-m", "snakemake", "--cores", str(cores), "--quiet", "all", *args],
                   cwd=workdir, env=env, check=True)
    return round(time.perf_counter() - t0, 2)


def job_table(bench_dir: Path) -> list[dict]:
    rows = []
    for tsv in sorted(bench_dir.rglob("*.tsv")):
        with open(tsv) as f:
            row = list(csv.DictReader(f, delimiter="\t"))[-1]
        rows.append({"job": tsv.relative_to(bench_dir).with_suffix("").as_posix(),
                     "seconds": float(row["s"]), "max_rss_mb": float(row["max_rss"]),
                     "cpu_seconds": float(row["cpu_time"])})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="kokoro-82m")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/anetts-build-benchmark"))
    ap.add_argument("--edit-stage", default="f0ntrain", help="stage module to edit for the rebuild timing")
    ap.add_argument("-o", "--output", type=Path, default=Path("build_benchmark.json"))
    args = ap.parse_args(argv)

    if args.workdir.exists():
        shutil.rmtree(args.workdir)
    args.workdir.mkdir(parents=True)
    for name in WORKFLOW_FILES:
        src = REPO / name
        (shutil.copytree(src, args.workdir / name, ignore=shutil.ignore_patterns("__pycache__"))
         if src.is_dir() else shutil.copy2(src, args.workdir / name))
    model_cfg = ("--config", f"model={args.model}")

    full = snakemake(args.workdir, args.cores, *model_cfg)
    jobs = job_table(args.workdir / "artifacts" / args.model / "benchmarks")
    noop = snakemake(args.workdir, args.cores, *model_cfg)
    stage_file = args.workdir / "anetts" / "models" / "kokoro" / "stages" / f"{args.edit_stage}.py"
    stage_file.write_text(stage_file.read_text() + "\n# benchmark edit\n")
    rebuild = snakemake(args.workdir, args.cores, *model_cfg)
    manifest = json.loads((args.workdir / "artifacts" / args.model / "manifest.json").read_text())
    summary = json.loads((args.workdir / "artifacts" / args.model / "parity_summary.json").read_text())

    result = {
        "model": args.model,
        "cores": args.cores,
        "full_build_s": full,
        "noop_s": noop,
        "rebuild_after_editing": {"stage": args.edit_stage, "seconds": rebuild},
        "packages": len(manifest["packages"]),
        "package_bytes": sum(p["bytes"] for p in manifest["packages"]),
        # worst-output dB of every package on the MIL executor, from the build's own parity summary
        "parity": {f"{r['stage']}/{r['bucket']}": {k: r.get(k) for k in ("passed", "mil_min_snr_db", "mil_outputs")}
                   for r in summary["buckets"]},
        "jobs": jobs,
        "peak_rss_mb": max(j["max_rss_mb"] for j in jobs),
        "sum_job_cpu_s": round(sum(j["cpu_seconds"] for j in jobs), 1),
        "provenance": provenance(),
    }
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("jobs", "provenance")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
