"""Inline SVG charts rendered on the server (no JavaScript, no chart library)."""

from __future__ import annotations

import math

from markupsafe import Markup, escape

from app.training.curves import Chart

PALETTE = ["#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
           "#7f7f7f", "#aec7e8", "#ffbb78", "#c5b0d5", "#c49c94"]
W, H = 720, 320
LEFT, RIGHT, TOP, BOTTOM = 74, 16, 16, 40


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def line_chart(chart: Chart) -> Markup:
    """The curves of ``chart``, the mean-prediction baseline as a dotted red line, the
    noise-free reference dashed green, overall black; a legend in HTML below."""
    lo, hi = chart.y_range()
    rounds = [r for s in chart.series for r, _ in s.points] or [1]
    x0, x1 = min(rounds), max(max(rounds), min(rounds) + 1)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x(r: float) -> float:
        return LEFT + (r - x0) / (x1 - x0) * pw

    def y(v: float) -> float:
        return TOP + (1 - (min(max(v, lo), hi) - lo) / (hi - lo)) * ph

    parts = [f'<svg class="chart" viewBox="0 0 {W} {H}" role="img" '
             f'aria-label="{escape(chart.title)}" xmlns="http://www.w3.org/2000/svg">',
             f"<title>{escape(chart.title)}</title>",
             f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#fff" '
             'stroke="#ccc"/>']
    decimals = max(0, 2 - math.floor(math.log10(max(hi - lo, 1e-9))))
    for t in _ticks(lo, hi):
        parts.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y(t):.1f}" y2="{y(t):.1f}" '
                     'stroke="#eee"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y(t) + 4:.1f}" text-anchor="end" '
                     f'font-size="13">{t:.{decimals}f}</text>')
    for t in _ticks(x0, x1, min(10, x1 - x0)):
        if abs(t - round(t)) < 1e-9:
            parts.append(f'<text x="{x(t):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle" '
                         f'font-size="13">{int(round(t))}</text>')
    parts.append(f'<text x="{LEFT + pw / 2}" y="{H - 6}" text-anchor="middle" '
                 'font-size="13">round</text>')
    parts.append(f'<text x="14" y="{TOP + ph / 2}" text-anchor="middle" font-size="13" '
                 f'transform="rotate(-90 14 {TOP + ph / 2})">{escape(chart.y_label)}</text>')
    legend = []
    if chart.baseline is not None:
        parts.append(f'<line class="baseline" x1="{LEFT}" x2="{W - RIGHT}" '
                     f'y1="{y(chart.baseline):.1f}" y2="{y(chart.baseline):.1f}" '
                     'stroke="#d62728" stroke-width="1.5" stroke-dasharray="2 3"/>')
        legend.append(("#d62728", "dotted",
                       f"predict each tenant's mean rating ({chart.baseline:.3f})"))
    colour = iter(PALETTE)
    for s in chart.series:
        if not s.points:
            continue
        if s.kind == "overall":
            stroke, width, dash, style = "#111", 3, "", "solid"
        elif s.kind == "reference":
            stroke, width, dash, style = "#2ca02c", 2.5, ' stroke-dasharray="8 4"', "dashed"
        else:
            stroke, width, dash, style = next(colour, "#999"), 1.5, "", "solid"
        pts = " ".join(f"{x(r):.1f},{y(v):.1f}" for r, v in s.points)
        parts.append(f'<polyline class="series {s.kind}" data-label="{escape(s.label)}" '
                     f'points="{pts}" fill="none" stroke="{stroke}" stroke-width="{width}"'
                     f'{dash}><title>{escape(s.label)}: last {s.points[-1][1]:.4f}</title>'
                     '</polyline>')
        legend.append((stroke, style, f"{s.label} (last {s.points[-1][1]:.4f})"))
    parts.append("</svg>")
    items = "".join(f'<li><span class="swatch" style="border-top: 3px {st} {c}"></span>'
                    f"{escape(label)}</li>" for c, st, label in legend)
    return Markup(f'<figure class="chart-box"><figcaption>{escape(chart.title)}'
                  f'</figcaption>{"".join(parts)}<ul class="legend">{items}</ul></figure>')


def histogram_chart(bars: list[tuple[float, int]], title: str) -> Markup:
    """Vertical bars of rating value -> count."""
    if not bars:
        return Markup("<p>No ratings yet.</p>")
    h, bottom, top = 200, 28, 18
    top_count = max(c for _, c in bars)
    bw = min(60, (W - 20) / len(bars))
    width = int(bw * len(bars) + 20)
    parts = [f'<svg class="hist" viewBox="0 0 {width} {h}" role="img" '
             f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">'
             f"<title>{escape(title)}</title>"]
    for i, (v, c) in enumerate(bars):
        bh = (h - bottom - top) * c / top_count
        x = 10 + i * bw
        parts.append(f'<rect x="{x + 2:.1f}" y="{h - bottom - bh:.1f}" width="{bw - 4:.1f}" '
                     f'height="{bh:.1f}" fill="#1f77b4"><title>{v:g}: {c}</title></rect>')
        parts.append(f'<text x="{x + bw / 2:.1f}" y="{h - bottom + 16}" text-anchor="middle" '
                     f'font-size="11">{v:g}</text>')
        parts.append(f'<text x="{x + bw / 2:.1f}" y="{h - bottom - bh - 4:.1f}" '
                     f'text-anchor="middle" font-size="10">{c}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
