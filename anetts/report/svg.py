"""Small inline SVG charts: the report needs no plotting library, script or network to show them.

Every bar carries `data-key` and `data-value` (the number it draws), so a test can check the
figure against the inputs, and a `<title>` tooltip for a person.
"""
from __future__ import annotations

from html import escape

PALETTE = {"pass": "#3b7dd8", "warn": "#e0a030", "fail": "#d0453a", "info": "#6a6a8a"}


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def hbar_chart(rows: list[dict], *, figure: str, unit: str, lines: list[tuple[float, str, str]] = (),
               width: int = 760, bar_h: int = 16, label_w: int = 190, title: str = "") -> str:
    """Horizontal bars. rows: {key, label, value, status?}; lines: (value, label, colour) markers."""
    values = [r["value"] for r in rows if r["value"] is not None]
    vmax = max([*values, *(v for v, _, _ in lines), 1e-12])
    vmax *= 1.1
    plot_w = width - label_w - 70
    top = 22 if title else 6
    height = top + len(rows) * (bar_h + 4) + 26
    x = lambda v: label_w + plot_w * max(v, 0.0) / vmax  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-figure="{escape(figure)}" '
           f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title or figure)}">']
    if title:
        out.append(f'<text x="4" y="14" class="ctitle">{escape(title)}</text>')
    for i, r in enumerate(rows):
        y = top + i * (bar_h + 4)
        out.append(f'<text x="{label_w - 6}" y="{y + bar_h - 4}" text-anchor="end" class="clabel">{escape(r["label"])}</text>')
        if r["value"] is None:
            out.append(f'<text x="{label_w + 4}" y="{y + bar_h - 4}" class="cval">n/a</text>')
            continue
        colour = PALETTE.get(r.get("status", "pass"), PALETTE["info"])
        w = max(x(r["value"]) - label_w, 1.0)
        out.append(f'<rect class="bar" x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{colour}" '
                   f'data-key="{escape(r["key"])}" data-value="{_fmt(r["value"])}">'
                   f'<title>{escape(r["label"])}: {_fmt(r["value"])} {escape(unit)}</title></rect>')
        out.append(f'<text x="{label_w + w + 4:.1f}" y="{y + bar_h - 4}" class="cval">{_fmt(r["value"])}</text>')
    bottom = top + len(rows) * (bar_h + 4)
    for v, label, colour in lines:
        out.append(f'<line x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{top - 4}" y2="{bottom}" stroke="{colour}" '
                   f'stroke-dasharray="4 3" data-line="{escape(label)}" data-value="{_fmt(v)}"/>')
        out.append(f'<text x="{x(v):.1f}" y="{bottom + 12}" text-anchor="middle" class="cline" fill="{colour}">'
                   f'{escape(label)} {_fmt(v)}</text>')
    out.append(f'<text x="{width - 4}" y="{height - 2}" text-anchor="end" class="cunit">{escape(unit)}</text>')
    out.append("</svg>")
    return "".join(out)
