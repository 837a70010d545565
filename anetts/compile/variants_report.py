"""A variant's manifest (the runtime contract, per variant directory) and the variants summary."""
from __future__ import annotations

import json
from pathlib import Path

from anetts.artifacts import atomic_outputs, write_json
from anetts.compile.manifest import write_manifest
from anetts.provenance import provenance


def write_variant_manifest(out: Path, variant: str, weights_dir: Path, reports: list, packages: list,
                           torchscripts: list, parity: list, model_meta: dict, stages: dict,
                           compressed: dict, assets_dir: Path | None = None) -> dict:
    """`artifacts/<model>/variants/<variant>/manifest.json`, loadable by `anetts.load(<that dir>)`.

    Same schema as the model's manifest. Compressed packages carry no `torchscript`: the export is
    the uncompressed model, so the torch backend would silently run other weights than the
    packages; it refuses instead (backend "mil" or "coreml" runs the variant).
    """
    out = Path(out)
    with atomic_outputs(out) as (tmp,):
        manifest = write_manifest(tmp, weights_dir, reports, packages, torchscripts, parity,
                                  {**model_meta, "variant": variant}, stages, assets_dir=assets_dir)
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
    b = report["backends"]["mil"]
    exact = {n: o["exact_fraction"] for n, o in b["outputs"].items() if "exact_fraction" in o}
    return {"min_snr_db": b["min_snr_db"], "exact_fraction": exact or None}


def variant_rows(reports: list) -> list[dict]:
    """One row per compressed package (passing: its report; failing: its `.failed.json`)."""
    rows = []
    for path in reports:
        path = Path(path)
        parity_dir = path.parents[2] / "parity" / path.parent.name
        failed = parity_dir / f"{path.stem}.failed.json"
        if path.is_file():
            r = json.loads(path.read_text(encoding="utf-8"))
            p = json.loads((parity_dir / f"{path.stem}.json").read_text(encoding="utf-8"))
            c = r["compression"]
            rows.append({"variant": c["variant"], "stage": r["stage"], "bucket": r["bucket"], "passed": True,
                         "settings": c["settings"], "bytes": r["bytes"], "base_bytes": c["base_bytes"],
                         "size_ratio": c["size_ratio"], "weight_ratio": c["weight_ratio"],
                         "gate_min_snr_db": p["gate"]["min_snr_db"], **_mil(p)})
        elif failed.is_file():
            p = json.loads(failed.read_text(encoding="utf-8"))
            z = p.get("sizes", {})
            rows.append({"variant": p["variant"], "stage": p["stage"], "bucket": p["bucket"], "passed": False,
                         "settings": p.get("settings"), "bytes": z.get("bytes"), "base_bytes": z.get("base_bytes"),
                         "size_ratio": z.get("size_ratio"), "weight_ratio": z.get("weight_ratio"),
                         "gate_min_snr_db": p["gate"]["min_snr_db"], **_mil(p)})
    return rows


def write_variants_summary(reports: list, base_parity: list, out_json: Path, out_md: Path) -> dict:
    base = {}
    for path in base_parity:
        r = json.loads(Path(path).read_text(encoding="utf-8"))
        base[(r["stage"], r["bucket"])] = _mil(r)["min_snr_db"]
    rows = variant_rows(reports)
    for row in rows:
        row["base_min_snr_db"] = base.get((row["stage"], row["bucket"]))
    summary = {"rows": rows, "provenance": provenance()}
    lines = ["| variant | stage | bucket | bytes / base | weights / base | worst dB (base) | gate | exact | passed |",
             "|---|---|---|---|---|---|---|---|---|"]

    def f(x, fmt):
        return "—" if x is None else format(x, fmt)

    for r in rows:
        exact = ", ".join(f"{k} {v:.3f}" for k, v in (r.get("exact_fraction") or {}).items()) or "—"
        lines.append(f"| {r['variant']} | {r['stage']} | {r['bucket']} | {f(r.get('size_ratio'), '.3f')} | "
                     f"{f(r.get('weight_ratio'), '.3f')} | {f(r['min_snr_db'], '.1f')} ({f(r['base_min_snr_db'], '.1f')}) | "
                     f"{r['gate_min_snr_db']} | {exact} | {'yes' if r['passed'] else 'NO'} |")
    with atomic_outputs(out_json, out_md) as (tj, tm):
        write_json(tj, summary)
        Path(tm).write_text("# Compressed variants\n\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return summary
