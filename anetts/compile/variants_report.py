"""A variant's manifest (the runtime contract, per variant directory) and the variants summary."""
from __future__ import annotations

import json
from pathlib import Path

from anetts.artifacts import atomic_outputs, failed_report_path, weight_file_bytes, write_json
from anetts.compile.manifest import write_manifest
from anetts.provenance import provenance


def write_variant_manifest(out: Path, variant: str, weights_dir: Path, reports: list, packages: list,
                           torchscripts: list, scenarios: list, parity: list, model_meta: dict, stages: dict,
                           compressed: dict, assets_dir: Path | None = None, chain: list = ()) -> dict:
    """`artifacts/<model>/variants/<variant>/manifest.json`, loadable by `anetts.load(<that dir>)`.

    Same schema as the model's manifest. Compressed packages carry no `torchscript`: the export is
    the uncompressed model, so the torch backend would silently run other weights than the
    packages; it refuses instead (backend "mil" or "coreml" runs the variant).
    """
    out = Path(out)
    with atomic_outputs(out) as (tmp,):
        manifest = write_manifest(tmp, weights_dir, reports, packages, torchscripts, scenarios, parity,
                                  {**model_meta, "variant": variant}, stages, assets_dir=assets_dir, chain=chain)
        for entry, report in zip(manifest["packages"], reports):
            c = json.loads(Path(report).read_text(encoding="utf-8")).get("compression")
            if c is None:
                continue
            for key in ("torchscript", "torchscript_sha256"):
                entry.pop(key, None)
            entry["compression"] = {k: c[k] for k in ("settings", "size_ratio", "weight_ratio", "base_bytes")}
        manifest["variant"] = {"name": variant, "compressed_stages": compressed,
                               "uncompressed_stages": [s for s in stages if s not in compressed]}
        write_json(tmp, manifest)
    return manifest


def _mil(report: dict) -> dict:
    """The MIL executor's verdict numbers: worst SNR, integer outputs' exact fractions, and where a
    stage declares logits the top-1 agreement of each over the scenario."""
    b = report["backends"]["mil"]
    exact = {n: o["exact_fraction"] for n, o in b["outputs"].items() if "exact_fraction" in o}
    top1 = {n: t["agreement"] for n, t in b.get("top1", {}).items()}
    return {"min_snr_db": b["min_snr_db"], "exact_fraction": exact or None, "top1": top1 or None}


def _row(r: dict | None, p: dict, passed: bool) -> dict:
    z = r["compression"] if r else p.get("sizes", {})
    return {"variant": p["variant"], "stage": p["stage"], "bucket": p["bucket"],
            "passed": passed, "settings": p.get("settings"), "bytes": (r or z).get("bytes"),
            "base_bytes": z.get("base_bytes"), "size_ratio": z.get("size_ratio"), "weight_ratio": z.get("weight_ratio"),
            "gate_min_snr_db": p["gate"]["min_snr_db"],
            # a gate's top-1 bound where the package has logits outputs to hold to it
            "gate_min_top1": p["gate"].get("min_top1") if p["backends"]["mil"].get("top1") else None, **_mil(p)}


def variant_rows(reports: list) -> list[dict]:
    """One row per compressed package (passing: its report; failing: its `.failed.json`)."""
    rows = []
    for path in reports:
        path = Path(path)
        parity = path.parents[2] / "parity" / path.parent.name / path.name
        failed = failed_report_path(parity)
        if path.is_file():
            r = json.loads(path.read_text(encoding="utf-8"))
            rows.append(_row(r, json.loads(parity.read_text(encoding="utf-8")), True))
        elif failed.is_file():
            rows.append(_row(None, json.loads(failed.read_text(encoding="utf-8")), False))
    return rows




def variant_totals(name: str, reports: list, packages: list, chain: list, settings: dict,
                   family: str | None = None, weights_dir: Path | None = None) -> dict:
    """One variant as a whole: bytes on disk and unique weight bytes of every package its manifest
    lists (compressed or base; functions of one package share their weights, so each package's
    weight files count once), its chain verdicts, and where the family projects speed, the weight
    bytes per generated frame and the ms they take (`FamilyDecl.frame_cost`)."""
    from anetts.families import declaration

    stages = [json.loads(Path(r).read_text(encoding="utf-8"))["stage"] for r in reports]
    sizes = [json.loads(Path(r).read_text(encoding="utf-8"))["bytes"] for r in reports]
    weights = {}
    for stage, pkg in zip(stages, packages):
        weights[stage] = weights.get(stage, 0) + weight_file_bytes(pkg)
    out = {"variant": name, "compressed_stages": sorted(settings), "bytes": sum(sizes),
           "unique_weight_bytes": sum(weights.values()), "weight_bytes_by_stage": weights, "chain": []}
    for c in chain:
        v = json.loads(Path(c).read_text(encoding="utf-8"))
        tf = v.get("teacher_forced", {})
        out["chain"].append({"bucket": Path(c).stem, "passed": v["passed"], "checks": v["checks"],
                             **{k: tf[k] for k in ("head_top1", "fast_codes_agreement", "slow_hidden_min_db") if k in tf},
                             "closed_loop_first_divergent_frame": v.get("closed_loop", {}).get("first_divergent_frame")})
    decl = declaration(family) if family else None
    if decl is not None and decl.frame_cost and weights_dir is not None:
        out["frame_cost"] = decl.hook("frame_cost")(Path(weights_dir), {s: settings.get(s) for s in weights}, weights)
    return out


def write_variants_summary(reports: list, base_parity: list, out_json: Path, out_md: Path,
                           variants: dict | None = None, family: str | None = None,
                           weights_dir: Path | None = None, base: dict | None = None) -> dict:
    """Per compressed package (rows) and per variant (totals, against the base model's `base`
    totals: the same computed for its own packages)."""
    base_db = {}
    for path in base_parity:
        r = json.loads(Path(path).read_text(encoding="utf-8"))
        base_db[(r["stage"], r["bucket"])] = _mil(r)["min_snr_db"]
    rows = variant_rows(reports)
    for row in rows:
        row["base_min_snr_db"] = base_db.get((row["stage"], row["bucket"]))
    totals = {}
    base_totals = None
    if base is not None:
        base_totals = variant_totals("base", base["reports"], base["packages"], [], {}, family, weights_dir)
    for name, v in (variants or {}).items():
        t = variant_totals(name, v["reports"], v["packages"], v.get("chain", []), v["settings"], family, weights_dir)
        if base_totals:
            t["bytes_ratio"] = round(t["bytes"] / base_totals["bytes"], 4)
            t["unique_weight_ratio"] = round(t["unique_weight_bytes"] / base_totals["unique_weight_bytes"], 4)
        totals[name] = t
    summary = {"rows": rows, "variants": totals, "base": base_totals, "provenance": provenance()}
    with atomic_outputs(out_json, out_md) as (tj, tm):
        write_json(tj, summary)
        Path(tm).write_text(summary_markdown(summary), encoding="utf-8")
    return summary


def summary_markdown(summary: dict) -> str:
    def f(x, fmt):
        return "—" if x is None else format(x, fmt)

    lines = ["# Compressed variants", "",
             "| variant | stage | bucket | bytes / base | weights / base | worst dB (base) | gate | exact / top-1 | passed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        marks = [f"{k} {v:.3f}" for k, v in (r.get("exact_fraction") or {}).items()]
        marks += [f"top-1 {k} {v:.3f}" for k, v in (r.get("top1") or {}).items()]
        gate = f"{r['gate_min_snr_db']} dB" + (f", top-1 {r['gate_min_top1']}" if r.get("gate_min_top1") is not None else "")
        lines.append(f"| {r['variant']} | {r['stage']} | {r['bucket']} | {f(r.get('size_ratio'), '.3f')} | "
                     f"{f(r.get('weight_ratio'), '.3f')} | {f(r['min_snr_db'], '.1f')} ({f(r.get('base_min_snr_db'), '.1f')}) | "
                     f"{gate} | {', '.join(marks) or '—'} | {'yes' if r['passed'] else 'NO'} |")
    if summary.get("variants"):
        lines += ["", "| variant | MB on disk | unique weight MB | x base | chain (codes agree, head top-1) | MB read / frame | ms / frame (M2 Max) |",
                  "|---|---|---|---|---|---|---|"]
        for t in [*([summary["base"]] if summary.get("base") else []), *summary["variants"].values()]:
            chain = "; ".join(f"{c['bucket']} {'pass' if c['passed'] else 'FAIL'} {f(c.get('fast_codes_agreement'), '.3f')}, "
                              f"{f(c.get('head_top1'), '.3f')}" for c in t["chain"]) or "—"
            fc = t.get("frame_cost")
            lines.append(f"| {t['variant']} | {t['bytes'] / 1e6:.2f} | {t['unique_weight_bytes'] / 1e6:.2f} | "
                         f"{f(t.get('unique_weight_ratio'), '.3f')} | {chain} | "
                         f"{f(fc and fc['total_bytes_per_frame'] / 1e6, '.2f')} | "
                         f"{f(fc and fc['projection']['M2 Max']['ms_per_frame'], '.2f')} |")
    return "\n".join(lines) + "\n"
