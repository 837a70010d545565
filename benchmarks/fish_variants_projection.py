"""Fish compression curve: bits vs weight bytes per frame at S2 Pro size vs parity measured on a build.

For each Fish variant of a config (default: this repo's config.yaml; the variants that apply to
Fish models), the weight bytes one S2 Pro frame reads under its settings (`frame_cost.frame_bytes`
on the fish-s2-pro preset's dimensions, per tensor as coremltools stores it) and the ms/frame that
projects to, beside what the variant measured where it was built (default: artifacts/fish-tiny):
per stage the worst per-call dB and top-1 agreement over the scenario, the compiled chain's
teacher-forced code agreement and head top-1, and whether every gate passed. Variants that failed
a gate are read from their `.failed.json`. Writes the table as JSON with -o.

    snakemake variants -c2 --keep-going --config model=fish-tiny
    python benchmarks/fish_variants_projection.py -o benchmarks/results/fish_variants_projection.json

`--variants FILE` adds the `variants:` of FILE to the config's, as `snakemake --configfile FILE`
merges them. The all-AR curve (benchmarks/fish_ar_variants.yaml) was measured so:

    snakemake -c2 --keep-going --configfile benchmarks/fish_ar_variants.yaml --config model=fish-tiny \
        -- artifacts/fish-tiny/variants/f-{int8,lut8,lut6,int4b32,lut4}/manifest.json
    python benchmarks/fish_variants_projection.py --variants benchmarks/fish_ar_variants.yaml \
        -o benchmarks/results/fish_variants_projection.json

and the slow-AR-only variants (benchmarks/fish_slow_variants.yaml) so:

    snakemake -c2 --keep-going --configfile benchmarks/fish_slow_variants.yaml --config model=fish-tiny \
        -- artifacts/fish-tiny/variants/fish-slow-{int8,lut6,lut4,int4}/manifest.json
    python benchmarks/fish_variants_projection.py --variants benchmarks/fish_slow_variants.yaml \
        -o benchmarks/results/fish_slow_variants_projection.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from anetts import artifacts  # noqa: E402
from anetts.models.fish.config import FishConfig  # noqa: E402
from anetts.models.fish.frame_cost import FRAME_MS, frame_bytes, projection  # noqa: E402
from anetts.models.fish.presets import preset  # noqa: E402
from anetts.provenance import provenance  # noqa: E402
from anetts.variants import VariantConfig  # noqa: E402
from anetts.workflow import WorkflowConfig, validate_config  # noqa: E402

TARGET_MS = FRAME_MS / 3  # 3x real time: 15.48 ms per 46.44 ms frame


def _read(path: Path) -> dict | None:
    failed = path.with_name(path.stem + ".failed.json")
    for p, passed in ((path, True), (failed, False)):
        if p.is_file():
            return {**json.loads(p.read_text()), "_passed": passed}
    return None


def measured(root: Path, model: str, name: str, vc: VariantConfig) -> dict:
    """Per compressed stage and per chain bucket, what the variant's build recorded (None: not built)."""
    stages = {}
    for stage in vc.stages(model, name):
        for bucket in vc.wf.buckets(model, stage):
            r = _read(artifacts.variant_parity_path(model, name, stage, bucket, root))
            if r is None:
                continue
            b = r["backends"]["mil"]
            stages[f"{stage}/{bucket}"] = {
                "passed": r["_passed"], "min_snr_db": b["min_snr_db"],
                "top1": {k: t["agreement"] for k, t in b.get("top1", {}).items()} or None,
                "weight_ratio": r["sizes"]["weight_ratio"]}
    chains = {}
    for bucket in vc.chain_buckets(model, name):
        r = _read(artifacts.variant_chain_path(model, name, bucket, root))
        if r is not None:
            tf = r["teacher_forced"]
            chains[bucket] = {"passed": r["_passed"], "fast_codes_agreement": tf["fast_codes_agreement"],
                              "head_top1": tf["head_top1"], "slow_hidden_min_db": tf["slow_hidden_min_db"],
                              "closed_loop_first_divergent_frame": r["closed_loop"]["first_divergent_frame"]}
    return {"stages": stages, "chain": chains}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=REPO / "config.yaml")
    ap.add_argument("--model", default="fish-tiny", help="the built model whose variants' parity is read")
    ap.add_argument("--root", type=Path, default=REPO / "artifacts")
    ap.add_argument("--at", default="fish-s2-pro", help="preset whose dimensions the bytes are counted at")
    ap.add_argument("--variants", type=Path, help="a YAML whose `variants:` are added to the config's")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    raw = yaml.safe_load(args.config.read_text())
    if args.variants:
        raw["variants"] = {**raw.get("variants", {}), **yaml.safe_load(args.variants.read_text())["variants"]}
    cfg = validate_config(raw)
    vc = VariantConfig(cfg, WorkflowConfig(cfg, root=REPO))
    at = FishConfig.from_dict(preset(args.at).config)
    rows = []
    fp16 = frame_bytes(at)
    for name in ["fp16", *vc.names_for(args.model)]:
        declared = {}
        if name != "fp16":
            for stage in vc.stages(args.model, name):
                declared.setdefault(vc.wf.decl(args.model).stage(stage).name, vc.settings(args.model, name, stage))
        try:
            b = frame_bytes(at, declared)
        except ValueError as e:  # e.g. a group size that does not divide a full-size channel count
            rows.append({"variant": name, "error": str(e)})
            continue
        proj = projection(b)
        row = {"variant": name, "settings": declared, "bytes_per_frame": b, "total_bytes_per_frame": sum(b.values()),
               "ratio_to_fp16": round(sum(b.values()) / sum(fp16.values()), 4), "projection": proj,
               "meets_3x_on_m2_max": proj["M2 Max"]["ms_per_frame"] <= TARGET_MS,
               "measured": measured(args.root, args.model, name, vc) if name != "fp16" else None}
        rows.append(row)
    print(f"bytes per frame at {args.at} dims; parity measured on {args.model} ({args.root}); "
          f"3x real time on M2 Max: <= {TARGET_MS:.2f} ms/frame")
    print(f"{'variant':12} {'GB/frame':>9} {'x fp16':>7} {'M2 Max ms':>9} {'rtfx':>5}  {'stage: dB / top-1 (gate)':52} chain codes / head")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:12} {r['error']}")
            continue
        m = r["measured"] or {"stages": {}, "chain": {}}
        st = " ".join(f"{k.split('/')[0]}:{v['min_snr_db']:.1f}" + (f"/{next(iter(v['top1'].values())):.3f}" if v["top1"] else "")
                      + ("" if v["passed"] else "!") for k, v in m["stages"].items())
        ch = " ".join(f"{c['fast_codes_agreement']:.3f}/{c['head_top1']:.3f}{'' if c['passed'] else '!'}"
                      for c in m["chain"].values()) or "-"
        p = r["projection"]["M2 Max"]
        print(f"{r['variant']:12} {r['total_bytes_per_frame'] / 1e9:9.3f} {r['ratio_to_fp16']:7.3f} "
              f"{p['ms_per_frame']:9.2f} {p['rtfx_ceiling']:5.2f}  {st or '-':52} {ch}")
    print("(! = failed its gate)")
    if args.output:
        args.output.write_text(json.dumps({"at": args.at, "parity_model": args.model, "target_ms_per_frame": TARGET_MS,
                                           "rows": rows, "provenance": provenance()}, indent=2) + "\n")
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
