"""Per-model parity summary: a markdown table, a JSON, and two plots.

Plots: the worst-output SNR of every stage and bucket (MIL executor vs upstream eager), and for the
largest generator bucket the waveform difference and the log-spectrogram difference.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from anetts.artifacts import atomic_outputs, write_json
from anetts.provenance import provenance


def _rows(reports: list) -> list[dict]:
    rows = []
    for path in reports:
        r = json.loads(Path(path).read_text(encoding="utf-8"))
        mil = r["backends"]["mil"]
        coreml = r["backends"].get("coreml", {})
        rows.append({
            "stage": r["stage"], "bucket": r["bucket"], "passed": r["passed"],
            "trace_min_snr_db": r["backends"]["torch_trace"]["min_snr_db"],
            "mil_min_snr_db": mil["min_snr_db"],
            "mil_outputs": {k: {m: v[m] for m in ("snr_db", "psnr_db", "max_abs", "pearson") if m in v}
                            | ({"exact_fraction": v["exact_fraction"]} if "exact_fraction" in v else {})
                            for k, v in mil["outputs"].items()},
            "coreml_min_snr_db": coreml.get("min_snr_db"),
            "torch_seconds": r["torch_seconds"], "mil_seconds": mil["seconds"],
            "mil_vs_torch_time_ratio": r["mil_vs_torch_time_ratio"],
            "gate": r["gate"],
        })
    return rows


def _markdown(model: str, rows: list[dict]) -> str:
    lines = [f"# Parity summary: {model}", "",
             "Worst float output SNR on the valid region vs upstream eager fp32 (dB); durations: exact-match fraction.",
             "", "| stage | bucket | trace | MIL executor | CoreML | pred_dur exact | executor/torch time | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        exact = r["mil_outputs"].get("pred_dur", {}).get("exact_fraction")
        coreml = "n/a (Linux)" if r["coreml_min_snr_db"] is None else f"{r['coreml_min_snr_db']:.1f}"
        lines.append(
            f"| {r['stage']} | {r['bucket']} | {r['trace_min_snr_db']:.1f} | {r['mil_min_snr_db']:.1f} | "
            f"{coreml} | "
            f"{'' if exact is None else f'{exact:.3f}'} | {r['mil_vs_torch_time_ratio']:.2f}× | "
            f"{'pass' if r['passed'] else 'FAIL'} |")
    return "\n".join(lines) + "\n"


def _snr_plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    labels = [f"{r['stage']}\n{r['bucket']}" for r in rows]
    ax.bar(range(len(rows)), [r["mil_min_snr_db"] for r in rows], color="tab:blue")
    gate = rows[0]["gate"] if rows else {"min_snr_db": 35, "target_snr_db": 50}
    ax.axhline(gate["min_snr_db"], color="tab:red", ls="--", label=f"gate {gate['min_snr_db']} dB")
    ax.axhline(gate["target_snr_db"], color="tab:green", ls=":", label=f"target {gate['target_snr_db']} dB")
    ax.set_xticks(range(len(rows)), labels, fontsize=7, rotation=90)
    ax.set_ylabel("worst-output SNR (dB)")
    ax.set_title("package (MIL reference executor) vs upstream eager fp32, per stage and bucket")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _log_spec(x: np.ndarray, n_fft: int = 1024, hop: int = 256) -> np.ndarray:
    if len(x) < n_fft:
        x = np.pad(x, (0, n_fft - len(x)))
    frames = np.lib.stride_tricks.sliding_window_view(x, n_fft)[::hop] * np.hanning(n_fft)
    return 20 * np.log10(np.abs(np.fft.rfft(frames, axis=-1)).T + 1e-6)


def _waveform_plot(reports: list, arrays: list, audio: dict, path: Path) -> None:
    """The family's audio output (`audio`: {stage, output, sample_rate}) of its longest bucket."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stage, name = audio.get("stage"), audio.get("output")
    # a stage whose package ends before the audio (Kokoro's folded generator: the host makes it) has none
    runs = [(Path(r), Path(a)) for r, a in zip(reports, arrays)
            if stage and (rep := json.loads(Path(r).read_text()))["stage"] == stage and name in rep["valid_regions"]]
    fig, axes = plt.subplots(3, 1, figsize=(10, 8))
    if not runs:
        axes[0].set_title(f"no package outputs audio{f' ({stage} ends before it)' if stage else ''}")
    if runs:
        last, last_arrays = max(runs, key=lambda ra: json.loads(ra[0].read_text())["valid_regions"][name][1])
        with np.load(last_arrays) as z:
            ref, got = z[f"reference/{name}"].ravel(), z[f"mil/{name}"].ravel()
        t = np.arange(len(ref)) / audio["sample_rate"]
        axes[0].plot(t, ref, lw=0.4, label="upstream eager fp32")
        axes[0].plot(t, got, lw=0.4, alpha=0.7, label="package (MIL executor)")
        axes[0].legend(loc="upper right")
        axes[0].set_title(f"{stage} {last.stem}: {name}")
        axes[1].plot(t, got - ref, lw=0.4, color="tab:red")
        axes[1].set_title("difference")
        im = axes[2].imshow(_log_spec(got) - _log_spec(ref), aspect="auto", origin="lower", cmap="coolwarm",
                            vmin=-3, vmax=3)
        axes[2].set_title("log-spectrogram difference (dB, package − reference)")
        axes[2].set_xlabel("frame (hop 256)")
        axes[2].set_ylabel("bin")
        axes[1].set_xlabel("seconds")
        fig.colorbar(im, ax=axes[2])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_summary(model: str, reports: list, arrays: list, audio: dict, out_md: Path, out_json: Path, out_snr: Path,
                  out_wave: Path) -> dict:
    rows = _rows(reports)
    summary = {"model": model, "all_passed": all(r["passed"] for r in rows), "buckets": rows,
               "provenance": provenance()}
    with atomic_outputs(out_md, out_json, out_snr, out_wave) as (md, js, snr, wave):
        Path(md).write_text(_markdown(model, rows), encoding="utf-8")
        write_json(js, summary)
        _snr_plot(rows, snr)
        _waveform_plot(reports, arrays, audio, wave)
    return summary
