"""One self-contained HTML report per built model: `artifacts/<model>/report.html`.

It shows what was verified and what it costs, from the build's own outputs only: parity per stage
and bucket against the gates (plus bundles), the generator's waveform difference and audio of the
parity examples, per package op histograms, ANE lint findings, sizes, I/O, deployment target and
compute-unit hint, bundle dedup ratios, Snakemake's per-job benchmarks, runtime benchmark JSONs,
every `anetts bench` JSON in `bench/` (from a Mac too), and the provenance of all of them.

    python -m anetts.report --model-dir artifacts/kokoro-tiny      # or the `report` rule of the DAG
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from anetts.report.collect import ReportInputError, collect
from anetts.report.inputs import discover_inputs, report_inputs
from anetts.report.render import render

__all__ = ["ReportInputError", "build_report", "collect", "discover_inputs", "render", "report_inputs"]


def build_report(inputs: dict[str, list[str]], out: Path) -> Path:
    """Read `inputs`, write the HTML to `out` (atomically: a failure leaves no report behind)."""
    from anetts.artifacts import atomic_outputs, clear_outputs

    clear_outputs(out)  # a stale report must not survive a failed one
    data = collect(inputs)
    html = render(data)
    with atomic_outputs(out) as (tmp,):
        Path(tmp).write_text(html, encoding="utf-8")
    return Path(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="anetts report", description="Render artifacts/<model>/report.html from a built "
                                "model directory (the same report as the DAG's `report` rule).")
    p.add_argument("--model-dir", type=Path, required=True, help="built model directory (artifacts/<model>)")
    p.add_argument("-o", "--output", type=Path, default=None, help="HTML path (default <model-dir>/report.html)")
    args = p.parse_args(argv)
    out = args.output or args.model_dir / "report.html"
    try:
        build_report(discover_inputs(args.model_dir), out)
    except (ReportInputError, FileNotFoundError, ValueError) as e:
        print(f"anetts report: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0
