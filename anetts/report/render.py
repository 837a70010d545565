"""The report as one self-contained HTML file: inline CSS and SVG, images and audio as data URIs.

Nothing is fetched when it is opened (no scripts, fonts or links off the page), so it can be mailed,
attached to an issue or opened from a published bundle as is.
"""
from __future__ import annotations

import datetime as _dt
from collections import defaultdict
from html import escape
from pathlib import Path

from anetts.report.collect import wav_data_uri
from anetts.report.svg import hbar_chart
from anetts.units import format_bytes, format_count

CSS = """
body{font:14px/1.45 -apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;margin:0;color:#1d1d28;background:#fafafc}
header{background:#1d2540;color:#fff;padding:18px 28px}header h1{margin:0 0 4px;font-size:22px}
header .sub{opacity:.8}main{padding:8px 28px 40px;max-width:1180px}
nav{margin:10px 0 4px}nav a{margin-right:14px;color:#3b5bb8;text-decoration:none}
section{background:#fff;border:1px solid #e2e2ea;border-radius:8px;padding:6px 18px 14px;margin:16px 0}
h2{font-size:18px;margin:12px 0 8px}h3{font-size:15px;margin:14px 0 6px}
table{border-collapse:collapse;margin:6px 0 10px;font-size:13px}th,td{border-bottom:1px solid #ececf2;padding:3px 9px;text-align:left;vertical-align:top}
th{background:#f3f3f8;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
.pass{color:#1d7a34;font-weight:600}.warn{color:#a86a00;font-weight:600}.fail{color:#b3261e;font-weight:700}
.badge{display:inline-block;padding:1px 8px;border-radius:9px;font-size:12px;font-weight:600}
.badge.pass{background:#dff3e4}.badge.fail{background:#fbe0dd;color:#b3261e}.badge.warn{background:#fdf0d5}
details{margin:4px 0}summary{cursor:pointer;color:#3b5bb8}
.chart text{font-size:11px;fill:#333}.chart .ctitle{font-weight:600;font-size:12px}.chart .cunit,.chart .cline{font-size:10px}
.muted{color:#777}.grid{display:flex;flex-wrap:wrap;gap:18px}.card{border:1px solid #e2e2ea;border-radius:6px;padding:6px 10px}
img.plot{max-width:100%;border:1px solid #e2e2ea}code{background:#f1f1f6;padding:0 3px;border-radius:3px}
"""


def _h(x) -> str:
    return escape(str(x))


def _num(v, fmt="{:.1f}", na="—") -> str:
    if v is None:
        return na
    try:
        return fmt.format(v)
    except (TypeError, ValueError):
        return _h(v)


def _table(head: list[str], rows: list[list[str]], cls: str = "", num_cols=()) -> str:
    out = [f'<table class="{cls}"><thead><tr>' + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"]
    for r in rows:
        out.append("<tr>" + "".join(f'<td class="num">{c}</td>' if i in num_cols else f"<td>{c}</td>" for i, c in enumerate(r)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _status(passed: bool, meets_target: bool | None = True) -> str:
    return "fail" if not passed else ("pass" if meets_target in (True, None) else "warn")


def _verdict(passed: bool, meets_target: bool | None = True) -> str:
    s = _status(passed, meets_target)
    return f'<span class="badge {s}">{ {"pass": "pass", "warn": "pass, below target", "fail": "FAIL"}[s] }</span>'


# ------------------------------------------------------------------------------------ sections

def _parity_section(d: dict) -> str:
    rows, table = [], []
    gates = {}
    for r in d["parity"]:
        mil = r["backends"]["mil"]
        key = f"{r['stage']}/{r['bucket']}"
        gates[json_key(r["gate"])] = r["gate"]
        rows.append({"key": key, "label": key, "value": mil.get("min_snr_db"),
                     "status": _status(mil["passed"], mil.get("meets_target"))})
        outs = sorted(mil["outputs"].items(), key=lambda kv: (kv[1].get("snr_db") is None, kv[1].get("snr_db") or 0))
        worst = outs[0][0] if outs else "—"
        coreml = r["backends"].get("coreml", {})
        cm = _num(coreml.get("min_snr_db")) if "min_snr_db" in coreml else f'<span class="muted">{_h(coreml.get("skipped", "—"))}</span>'
        detail = _table(["output", "SNR dB", "PSNR dB", "max |Δ|", "pearson", "exact fraction"],
                        [[_h(n), _num(v.get("snr_db")), _num(v.get("psnr_db")), _num(v.get("max_abs"), "{:.3g}"),
                          _num(v.get("pearson"), "{:.6f}"), _num(v.get("exact_fraction"), "{:.3f}")] for n, v in outs],
                        num_cols=(1, 2, 3, 4, 5))
        table.append([f'<span data-parity="{_h(key)}">{_h(key)}</span>',
                      _num(r["backends"]["torch_trace"].get("min_snr_db")), _num(mil.get("min_snr_db")), cm,
                      _num(r["gate"].get("min_snr_db"), "{:g}"), _num(r["gate"].get("target_snr_db"), "{:g}"),
                      _h(worst), _num(r.get("mil_vs_torch_time_ratio"), "{:.2f}×"),
                      _verdict(r["passed"], mil.get("meets_target")) + f"<details><summary>outputs</summary>{detail}</details>"])
    lines = []
    if len(gates) == 1:
        g = next(iter(gates.values()))
        lines = [(g["min_snr_db"], "gate", "#d0453a"), (g["target_snr_db"], "target", "#1d7a34")]
    chart = hbar_chart(rows, figure="parity-snr", unit="dB (worst float output, MIL executor vs upstream eager fp32)",
                       lines=lines, title="package vs upstream, per stage and bucket")
    bundle_rows, btable = [], []
    for b in d["bundle_parity"]:
        for bucket, f in b["functions"].items():
            key = f"{b['stage']}:{f.get('function', bucket)}"
            bundle_rows.append({"key": key, "label": f"bundle {key}", "value": f.get("min_snr_db"),
                                "status": _status(f["passed"], f.get("meets_target"))})
            btable.append([_h(b["stage"]), _h(f.get("function", bucket)), _h(bucket), _num(f.get("min_snr_db")),
                           _verdict(f["passed"], f.get("meets_target"))])
    out = ["<section id='parity'><h2>Parity</h2>",
           f"<p>Every package run by the MIL reference executor (and Core ML on macOS) against the upstream eager fp32 "
           f"model on the valid region. Overall: {_verdict(d['summary']['all_passed'])}</p>", chart,
           _table(["stage/bucket", "trace dB", "MIL dB", "Core ML dB", "gate dB", "target dB", "worst output",
                   "executor / torch time", "verdict"], table, num_cols=(1, 2, 4, 5, 7))]
    if bundle_rows:
        out += ["<h3>Bundles (multifunction), every function through the same gate</h3>",
                hbar_chart(bundle_rows, figure="bundle-parity-snr", unit="dB", lines=lines),
                _table(["stage", "function", "bucket", "worst SNR dB", "verdict"], btable, num_cols=(3,))]
    ao = d.get("audio_output") or {}
    sr = int(ao.get("sample_rate", 24000))
    for uri in d["waveform_plot"]:
        out.append(f"<h3>{_h(ao.get('stage', 'audio'))}: {_h(ao.get('output', ''))} and log-spectrogram difference (largest bucket)</h3>"
                   f'<img class="plot" data-figure="waveform-diff" alt="waveform and spectrogram difference" src="{uri}">')
    if d["audio"]:
        out.append(f"<h3>Listen: parity examples ({_h(ao.get('stage', ''))}, valid region)</h3><div class='grid'>")
        for a in d["audio"]:
            out.append(f"<div class='card'><b>{_h(a['stage'])}/{_h(a['bucket'])}</b>")
            for name, wave in a["waves"].items():
                label = "upstream eager fp32" if name == "reference" else f"package ({name})"
                out.append(f"<div>{_h(label)} · {wave.size / sr:.2f} s<br>"
                           f'<audio controls preload="metadata" data-audio="{_h(a["bucket"])}/{_h(name)}" '
                           f'src="{wav_data_uri(wave, sr)}"></audio></div>')
            out.append("</div>")
        out.append("</div>")
    out.append("</section>")
    return "".join(out)


_LISTEN_METRICS = {  # metric -> (label, number format)
    "token_error_rate": ("transcript edits per token vs upstream's", "{:.4f}"),
    "speaker_cosine_mean": ("speaker cosine, mean", "{:.4f}"), "speaker_cosine_min": ("speaker cosine, worst clip", "{:.4f}"),
    "distillmos_delta": ("DistillMOS change", "{:+.3f}"), "dnsmos_p808_delta": ("DNSMOS P.808 change", "{:+.3f}"),
    "pitch_cents": ("pitch error, cents RMSE", "{:.1f}"), "voicing_disagreement": ("voicing disagreement", "{:.3f}"),
    "log_mel_l1": ("log-mel distance, nats", "{:.4f}"),
}


def _listen_section(d: dict) -> str:
    out = ["<section id='listen'><h2>Listening</h2>"]
    if not d.get("listen"):
        out.append("<p class='muted'>No listener gate for this model: it runs on real weights only (a model "
                   "with a <code>listen</code> block in config.yaml), because synthetic weights make speech-shaped "
                   "noise and upstream's own rendering has no words, voice or pitch to judge. This build is held "
                   "to its parity gates and the end-to-end check.</p></section>")
        return "".join(out)
    for rep in d["listen"]:
        out.append(f"<p>The corpus spoken by upstream at two seeds and by the compiled packages ({_h(rep.get('backend'))}); "
                   f"each metric holds within upstream's own seed-to-seed floor plus its margin. "
                   f"Overall: {_verdict(rep['passed'])}</p>")
        for language, lang in rep["languages"].items():
            rows = [[_h(_LISTEN_METRICS[k][0]), _num(c["candidate"], _LISTEN_METRICS[k][1]),
                     _num(c["floor"], _LISTEN_METRICS[k][1]), _num(c["limit"], _LISTEN_METRICS[k][1]),
                     _verdict(c["passed"])] for k, c in lang["checks"].items()]
            out.append(f"<h3 data-listen='{_h(language)}'>{_h(language)}: {lang['clips']} clips, "
                       f"{lang['seconds']:.0f} s of audio</h3>")
            out.append(_table(["metric", "build", "upstream floor", "limit", "verdict"], rows, num_cols=(1, 2, 3)))
            cards = ["<div class='grid'>"]
            for metric, w in (lang.get("worst") or {}).items():
                row = lang["rows"][w["row"]]
                cards.append(f"<div class='card'><b>worst for {_h(_LISTEN_METRICS[metric][0])}</b><br>"
                             f"{_h(row['sentence']['text'])} <span class='muted'>({_h(row['sentence']['voice'])})</span><br>"
                             f"upstream: <i>{_h(row['reference_transcript'])}</i><br>"
                             f"build: <i>{_h(row['candidate']['transcript'])}</i>"
                             f"<div>upstream<br><audio controls preload='none' src='{w['reference_uri']}'></audio></div>"
                             f"<div>build<br><audio controls preload='none' data-listen-clip='{_h(language)}/{_h(metric)}' "
                             f"src='{w['candidate_uri']}'></audio></div></div>")
            cards.append("</div>")
            out.append("".join(cards))
    out.append("</section>")
    return "".join(out)


def json_key(d) -> str:
    import json

    return json.dumps(d, sort_keys=True)


def _packages_section(d: dict) -> str:
    man = {(p["stage"], p["bucket"]): p for p in d["manifest"]["packages"]}
    reports = {(r["stage"], r["bucket"]): r for r in d["package_reports"]}
    out = ["<section id='packages'><h2>Packages</h2>",
           "<p>What each package holds and where it is meant to run. Lint findings are static: only a compute plan "
           "on a Mac (<code>anetts bench</code>, <code>anetts inspect --compute-plan</code>) shows real placement.</p>"]
    rows = []
    details = []
    for r, ins in zip(d["parity"], d["inspect"]):
        key = (r["stage"], r["bucket"])
        m, rep = man.get(key, {}), reports.get(key, {})
        fns = ins["functions"]
        ops = sum(f["op_count"] for f in fns.values())
        wbytes = sum(f["weight_bytes"] for f in fns.values())
        n_lint = len(ins["lint"])
        sev = sorted({f.get("severity", "?") for f in ins["lint"]})
        label = f"{r['stage']}/{r['bucket']}"
        rows.append([f'<span data-package="{_h(label)}">{_h(label)}</span>', format_bytes(ins["bytes"]), format_bytes(wbytes),
                     _h(ins["deployment_target"]), _h(m.get("precision", rep.get("precision", "—"))),
                     _h(m.get("compute_units", "—")), str(ops),
                     f'<span data-lint="{_h(label)}" data-count="{n_lint}">{n_lint}</span> {_h(", ".join(sev))}'])
        parts = [f"<details><summary>{_h(label)}: ops, I/O, lint</summary>"]
        for fname, f in fns.items():
            hist = sorted(f["ops"].items(), key=lambda kv: -kv[1])
            parts.append(f"<h3>{_h(label)} · function <code>{_h(fname)}</code> (opset {_h(f.get('opset'))}, "
                         f"{f['op_count']} ops, {format_bytes(f['weight_bytes'])} weights)</h3>")
            parts.append(hbar_chart([{"key": f"{label}:{fname}:{op}", "label": op, "value": n, "status": "info"}
                                     for op, n in hist], figure=f"ops:{label}:{fname}", unit="ops", bar_h=12))
            io_rows = [[_h(kind), _h(t.get("name")), _h(t.get("dtype")), _h(t.get("shape"))]
                       for kind in ("inputs", "outputs") for t in f.get(kind, [])]
            parts.append(_table(["", "name", "dtype", "shape"], io_rows))
        if ins["lint"]:
            parts.append(_table(["rule", "severity", "count", "function", "message", "reason", "source"],
                                [[_h(x["rule"]), f'<span class="{"fail" if x.get("severity") == "error" else "warn"}">{_h(x.get("severity"))}</span>',
                                  _h(x.get("count")), _h(x.get("function")), _h(x.get("message")), _h(x.get("reason")),
                                  _h(x.get("source"))] for x in ins["lint"]]))
        else:
            parts.append("<p class='muted'>no static ANE lint findings</p>")
        parts.append("</details>")
        details.append("".join(parts))
    out.append(_table(["stage/bucket", "package bytes", "weight bytes", "deployment target", "precision",
                       "compute units (hint)", "ops", "lint findings"], rows, num_cols=(1, 2, 6)))
    out += details
    if d["bundles"]:
        brow = []
        for b in d["bundles"]:
            stage = Path(b["_path"]).stem
            brow.append([f'<span data-bundle="{_h(stage)}">{_h(stage)}</span>', _h(", ".join(b["functions"])),
                         format_bytes(b["bundle_bytes"]), format_bytes(b.get("input_bytes_sum")), format_bytes(b["weight_bytes_fp16"]),
                         f'<span data-ratio="{_h(stage)}">{_num(b["ratio"], "{:.3f}")}</span>',
                         _num(b.get("goal_ratio"), "≤ {:g}"),
                         '<span class="pass">met</span>' if b.get("goal_met") else '<span class="fail">not met</span>'])
        out += ["<h3>Bundles: weight deduplication</h3>",
                "<p>ratio = bundle bytes / fp16 bytes of the unique weights (1.0: every bucket shares one copy).</p>",
                _table(["stage", "functions", "bundle bytes", "Σ per-bucket packages", "unique weights (fp16)", "ratio",
                        "goal", ""], brow, num_cols=(2, 3, 4, 5))]
    out.append("</section>")
    return "".join(out)


def _build_section(d: dict) -> str:
    if not d["jobs"]:
        return ""
    per_rule = defaultdict(lambda: {"n": 0, "s": 0.0, "cpu": 0.0, "rss": 0.0})
    for j in d["jobs"]:
        a = per_rule[j["rule"]]
        a["n"] += 1
        a["s"] += j["seconds"]
        a["cpu"] += j["cpu_seconds"]
        a["rss"] = max(a["rss"], j["max_rss_mb"] or 0.0)
    rules = sorted(per_rule.items(), key=lambda kv: -kv[1]["s"])
    chart = hbar_chart([{"key": r, "label": f"{r} ({a['n']})", "value": a["s"], "status": "info"} for r, a in rules],
                       figure="build-wall", unit="s wall, summed over the rule's jobs", title="build time per rule")
    out = ["<section id='build'><h2>Build benchmark</h2>",
           "<p>From Snakemake's <code>benchmark:</code> file of every job (its last run).</p>", chart,
           _table(["rule", "jobs", "Σ wall s", "Σ CPU s", "peak RSS MB"],
                  [[_h(r), str(a["n"]), f"{a['s']:.1f}", f"{a['cpu']:.1f}", f"{a['rss']:.0f}"] for r, a in rules],
                  num_cols=(1, 2, 3, 4)),
           "<details><summary>every job</summary>",
           _table(["job", "wall s", "CPU s", "peak RSS MB"],
                  [[f'<span data-job="{_h(j["job"])}">{_h(j["job"])}</span>', f"{j['seconds']:.2f}",
                    f"{j['cpu_seconds']:.2f}", _num(j["max_rss_mb"], "{:.0f}")] for j in d["jobs"]], num_cols=(1, 2, 3)),
           "</details></section>"]
    return "".join(out)


def _runtime_section(d: dict) -> str:
    if not d["runtime_benchmarks"]:
        return ""
    out = ["<section id='runtime'><h2>Runtime benchmarks</h2>"]
    for b in d["runtime_benchmarks"]:
        name = Path(b["_path"]).name
        out.append(f"<h3>{_h(name)}</h3><p class='muted'>{_h(b.get('benchmark', ''))} {_h(b.get('label') or '')}</p>")
        if isinstance(b.get("texts"), list) and b["texts"] and "runtime" in b["texts"][0]:
            out.append(_table(["target s", "audio s", "buckets", "runtime median s", "RTF", "upstream median s", "upstream / runtime"],
                              [[_h(t.get("target_s")), _num(t.get("audio_s"), "{:.2f}"), _h(t.get("buckets")),
                                _num(t["runtime"].get("median_s"), "{:.3f}"), _num(t["runtime"].get("rtf"), "{:.3f}"),
                                _num(t.get("upstream", {}).get("median_s"), "{:.3f}"),
                                _num(t.get("ratio_upstream_over_runtime"), "{:.2f}")] for t in b["texts"]],
                              num_cols=(1, 3, 4, 5, 6)))
        else:
            scalars = [[_h(k), _h(v)] for k, v in b.items() if not k.startswith("_") and isinstance(v, (int, float, str, bool))]
            out.append(_table(["key", "value"], scalars))
    out.append("</section>")
    return "".join(out)


def _bench_section(d: dict) -> str:
    model = d["manifest"]["model"]
    out = ["<section id='bench'><h2>On-device benchmarks (<code>anetts bench</code>)</h2>"]
    if not d["bench"]:
        out.append(f"<p class='muted'>No bench JSON in <code>artifacts/{_h(model)}/bench/</code> yet. On a Mac: "
                   f"<code>anetts bench --model-dir artifacts/{_h(model)}</code>, then drop the JSON it writes into that "
                   "folder (or send it back) and rebuild the report.</p></section>")
        return "".join(out)
    for b in sorted(d["bench"], key=lambda b: b["created_utc"]):
        name = Path(b["_path"]).name
        other = "" if b["model"] == model else f' <span class="warn">(model {_h(b["model"])}, not {_h(model)})</span>'
        m = b["provenance"].get("machine", {})
        out.append(f"<h3 data-bench='{_h(name)}'>{_h(b['chip'])} · {_h(b['backend'])} · {_h(b['created_utc'])}{other}</h3>"
                   f"<p class='muted'>{_h(name)} · {_h(m.get('system'))} {_h(m.get('release'))} {_h(m.get('machine'))} · "
                   f"compute units {_h(b.get('compute_units') or 'per stage from the manifest')} · "
                   f"{_h(b['settings'].get('iterations'))} iterations, {_h(b['settings'].get('warmup'))} warm-up, "
                   f"order seed {_h(b['settings'].get('seed'))} · peak RSS {format_bytes(b['memory'].get('peak_rss_bytes'))}</p>")
        ups = sorted({dev for r in b["end_to_end"] for dev in r.get("upstream", {})})
        head = ["target s", "audio s", "median s", "p90 s", "p95 s", "RTF"] + [f"upstream {u} median s" for u in ups] + \
               [f"upstream {u} / runtime" for u in ups] + ["per stage, median s"]
        rows = []
        for r in b["end_to_end"]:
            up = r.get("upstream", {})
            rows.append([_h(r["target_s"]), _num(r["audio_s"], "{:.2f}"), _num(r["warm"]["median_s"], "{:.4f}"),
                         _num(r["warm"]["p90_s"], "{:.4f}"), _num(r["warm"]["p95_s"], "{:.4f}"),
                         f'<span data-rtf="{_h(name)}:{_h(r["target_s"])}">{r["rtf_median"]:.4f}</span>']
                        + [_num(up.get(u, {}).get("warm", {}).get("median_s"), "{:.4f}") for u in ups]
                        + [_num(up.get(u, {}).get("ratio_upstream_over_runtime"), "{:.2f}×") for u in ups]
                        + [_h(" · ".join(f"{k} {v:.3f}" for k, v in (r.get("stages_median_s") or {}).items())
                              + "".join(f" · per frame {k} {v * 1e3:.2f} ms"
                                        for k, v in (r.get("per_frame_median_s") or {}).items()))])
        out.append("<b>End to end through the runtime</b>" + _table(head, rows, num_cols=tuple(range(len(head) - 1))))
        for dev, info in (b.get("upstream") or {}).items():
            if not info.get("available", True):
                out.append(f"<p class='muted'>upstream {_h(dev)}: {_h(info.get('reason'))}</p>")
        out.append("<b>Per package</b>" + _table(
            ["stage/bucket", "compute units", "load s", "first call s", "warm median s", "p95 s"],
            [[_h(s.get("label") or f"{s['stage']}/{s['bucket']}"), _h(s.get("compute_units") or "—"), _num(s["load_s"], "{:.3f}"),
              _num(s["first_call_s"], "{:.4f}"), _num(s["warm"]["median_s"], "{:.4f}"), _num(s["warm"]["p95_s"], "{:.4f}")]
             for s in b["stages"]], num_cols=(2, 3, 4, 5)))
        plan = b.get("compute_plan") or {}
        if plan.get("available"):
            out.append("<b>Compute plan (MLComputePlan, preferred device per op)</b>" + _table(
                ["stage/bucket", "compute units", "ops by device", "ANE op fraction"],
                [[_h(k), _h(v.get("compute_units", "")), _h(v.get("by_device", v.get("error", ""))),
                  _num(v.get("ane_op_fraction"), "{:.2f}")] for k, v in plan.get("packages", {}).items()], num_cols=(3,)))
        elif plan:
            out.append(f"<p class='muted'>compute plan: {_h(plan.get('reason'))}</p>")
        placed = b.get("placement")
        if placed:
            rows = []
            for stage, st in placed["stages"].items():
                ne, gpu = (st["units"].get(u, {}) for u in ("CPU_AND_NE", "CPU_AND_GPU"))
                rows.append([_h(stage), _h(st["bucket"]), _num(ne.get("median_s"), "{:.4f}"), _num(gpu.get("median_s"), "{:.4f}"),
                             _h(((ne.get("plan") or {}).get("by_device")) or (ne.get("plan") or {}).get("error") or "—"),
                             _num((ne.get("plan") or {}).get("ane_op_fraction"), "{:.2f}"),
                             f"<b data-placement='{_h(stage)}'>{_h(st['chosen'])}</b>"])
            out.append("<b>Placement (<code>--placement</code>: each stage's largest bucket on the Neural Engine and "
                       "on the GPU; a Core ML runtime on this chip runs each stage on the faster)</b>" + _table(
                ["stage", "bucket", "CPU_AND_NE median s", "CPU_AND_GPU median s", "CPU_AND_NE plan: ops by device",
                 "ANE op fraction", "chosen"], rows, num_cols=(2, 3, 5)))
    out.append("</section>")
    return "".join(out)


def _ane_share_section(d: dict) -> str:
    """The manifest's ANE-eligible share (anetts.compile.ane_share): per stage, MACs per second of audio
    and whether they count as Neural Engine work."""
    share = d["manifest"].get("ane_share")
    out = ["<section id='ane-share'><h2>ANE-eligible share</h2>"]
    if not share:
        out.append("<p class='muted'>not in this manifest (written by an older anetts)</p></section>")
        return "".join(out)
    if share.get("share") is None:
        out.append(f"<p class='muted'>not defined for this build: {_h(share.get('undefined'))}</p></section>")
        return "".join(out)
    out.append(f"<p><b data-ane-share='{share['share']:.6f}'>{100 * share['share']:.1f} %</b> of the model's "
               f"multiply-accumulates per second of audio: {format_count(share['eligible_macs_per_second'])} of "
               f"{format_count(share['macs_per_second'])} MAC/s. {_h(share['definition'])}. Static, from the programs' "
               "shapes and lint: only a compute plan on a Mac shows placement.</p>")
    rows = []
    for s in share["stages"]:
        verdict = '<span class="pass">yes</span>' if s["eligible"] else '<span class="fail">no</span>'
        rows.append([f'<span data-share-stage="{_h(s["stage"])}">{_h(s["stage"])}</span>',
                     f"{_h(s['bucket'])} ({s['audio_seconds']:.3g} s)", format_count(s["macs"]),
                     format_count(s["macs_per_second"]), _num(100 * s["share_of_total"], "{:.1f} %"),
                     verdict, _h("; ".join(s["why_not"]) or "—")])
    out.append(_table(["stage", "bucket (audio)", "MACs per call", "MACs per audio second", "share of all",
                       "eligible", "why not"], rows, num_cols=(2, 3, 4)))
    out.append("</section>")
    return "".join(out)


def _provenance_section(d: dict) -> str:
    out = ["<section id='provenance'><h2>Provenance</h2><p>Every figure above comes from a file carrying one of "
           "these blocks (commit, tool versions, machine).</p>"]
    for i, p in enumerate(d["provenance"]):
        b = p["block"]
        git = b.get("git", {})
        v = ", ".join(f"{k} {x}" for k, x in (b.get("versions") or {}).items() if x)
        m = b.get("machine", {})
        out.append(f"<div class='card' data-provenance='{i}'><b>commit</b> <code>{_h(git.get('commit') or 'unknown (not a git checkout)')}</code>"
                   f"{' (dirty)' if git.get('dirty') else ''}<br><b>tools</b> {_h(v)}<br><b>machine</b> "
                   f"{_h(m.get('system'))} {_h(m.get('release'))} {_h(m.get('machine'))}, {_h(m.get('cpu_count'))} CPUs, "
                   f"Python {_h(m.get('python'))}<details><summary>{len(p['files'])} file(s)</summary>"
                   + "<br>".join(_h(f) for f in p["files"]) + "</details></div>")
    out.append("</section>")
    return "".join(out)


def render(d: dict) -> str:
    man = d["manifest"]
    model = man["model"]
    src = man.get("source") or man.get("weights", {})
    stages = man.get("stages", {})
    n_pkg = len(man["packages"])
    st_rows = [[_h(s), _h(", ".join(v.get("buckets", []))), _h(v.get("deployment_target")), _h(v.get("precision")),
                _h(v.get("compute_units")), _h(v.get("linear_rewrite"))] for s, v in stages.items()]
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    git = man["provenance"].get("git", {})
    overview = ("<section id='overview'><h2>Overview</h2>"
                f"<p>{n_pkg} verified packages, {len(man.get('bundles', []))} bundles. Parity overall: "
                f"{_verdict(d['summary']['all_passed'])}</p>"
                + _table(["stage", "buckets", "deployment target", "precision", "compute units (hint)", "linear rewrite"], st_rows)
                + f"<p class='muted'>weights: {_h(src.get('source') if isinstance(src, dict) else src)} "
                  f"{_h((man.get('weights') or {}).get('revision') or (man.get('weights') or {}).get('preset') or '')}</p></section>")
    body = [overview, _ane_share_section(d), _parity_section(d), _listen_section(d), _packages_section(d), _build_section(d),
            _runtime_section(d), _bench_section(d), _provenance_section(d)]
    nav = "".join(f'<a href="#{i}">{t}</a>' for i, t in (("overview", "Overview"), ("ane-share", "ANE share"),
                                                        ("parity", "Parity"),
                                                        ("listen", "Listening"),
                                                        ("packages", "Packages"), ("build", "Build"),
                                                        ("runtime", "Runtime"), ("bench", "On-device bench"),
                                                        ("provenance", "Provenance")))
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width,initial-scale=1'>"
            f"<title>ane-tts report: {_h(model)}</title><style>{CSS}</style></head><body>"
            f"<header><h1>ane-tts build report: {_h(model)}</h1><div class='sub'>family {_h(man.get('family'))} · "
            f"commit <code>{_h((git.get('commit') or '')[:12] or 'unknown (not a git checkout)')}</code>"
            f"{' (uncommitted changes)' if git.get('dirty') else ''} · rendered {now}</div></header>"
            f"<main><nav>{nav}</nav>{''.join(body)}</main></body></html>\n")
