"""Bits vs size vs parity of every compressed variant built so far (passing and failing ones).

Reads what `snakemake variants --keep-going` left under artifacts/<model>/variants/ (the package
reports of passing variants, the `.failed.json` of failing ones) and the base parity reports,
prints one table and writes it as JSON. The `variants_summary` rule covers only a complete set of
passing variants; this also shows the ones that failed their gate, with their measured dB.

    python benchmarks/variants_table.py --model kokoro-tiny [-o variants_table.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from anetts import artifacts  # noqa: E402
from anetts.compile.variants_report import variant_rows  # noqa: E402
from anetts.provenance import provenance  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="kokoro-tiny")
    ap.add_argument("--root", type=Path, default=REPO / "artifacts")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    vroot = artifacts.model_dir(args.model, args.root) / "variants"
    if not vroot.is_dir():
        sys.exit(f"no variants under {vroot}; run `snakemake variants --keep-going` first")
    reports = sorted({*vroot.glob("*/packages/*/*.json"),
                      *(p.parents[2] / "packages" / p.parent.name / p.name.replace(".failed.json", ".json")
                        for p in vroot.glob("*/parity/*/*.failed.json"))})
    rows = variant_rows(reports)
    base = {}
    for p in (artifacts.model_dir(args.model, args.root) / "parity").glob("*/*.json"):
        if p.name.endswith(".failed.json"):
            continue
        r = json.loads(p.read_text())
        base[(r["stage"], r["bucket"])] = r["backends"]["mil"]["min_snr_db"]
    print(f"{'variant':8} {'stage':12} {'bucket':6} {'bytes/base':>10} {'weights/base':>12} {'worst dB':>9} "
          f"{'base dB':>8} {'exact':>14} {'>=35 dB':>8} gate")
    for r in sorted(rows, key=lambda r: (r["stage"], r["variant"])):
        r["base_min_snr_db"] = base.get((r["stage"], r["bucket"]))
        exact = ",".join(f"{v:.3f}" for v in (r.get("exact_fraction") or {}).values()) or "-"
        ok35 = r["min_snr_db"] is not None and r["min_snr_db"] >= 35 and all(
            v >= 0.95 for v in (r.get("exact_fraction") or {}).values())
        def f(x, fmt):
            return "-" if x is None else format(x, fmt)
        print(f"{r['variant']:8} {r['stage']:12} {r['bucket']:6} {f(r.get('size_ratio'), '.3f'):>10} "
              f"{f(r.get('weight_ratio'), '.3f'):>12} {f(r['min_snr_db'], '.1f'):>9} {f(r['base_min_snr_db'], '.1f'):>8} "
              f"{exact:>14} {'yes' if ok35 else 'no':>8} {'pass' if r['passed'] else 'FAIL'}")
        r["passes_35_db"] = ok35
    if args.output:
        args.output.write_text(json.dumps({"model": args.model, "rows": rows, "provenance": provenance()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
