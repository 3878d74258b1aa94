"""The class report's figure: the totals' histogram above one per exercise, as SVG.

A figure of a few dozen rectangles and labels, written as text: no plotting
library to import (matplotlib cost each grading run about 1.5 CPU-s, import
and drawing), sharp at any zoom, and shown by every browser and by Markdown
viewers beside ``report.md``.

Bins: a total falls in one of ``min(ceil(maxp), 40)`` equal bins over
``[0, maxp]`` (the last one closed); an exercise's score in the bin of the
nearest whole point, ``floor(score + 1/2)`` (a partial 2.4 counts as 2).
Counts are students.  Everything written comes from the course (titles,
points) or is a number; titles are escaped anyway.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from xml.sax.saxutils import escape

# one panel per exercise, five a row; the totals' panel spans the row
PANEL_W, PANEL_H = 240, 200
PLOT = (44, 44, 12, 34)  # left, top, right, bottom margins of a panel's axes
TITLE_CHARS = 34  # a title line at 11 px fits a panel
COLS = 5
MAX_TOTAL_BINS = 40
TOTALS_COLOUR, EXERCISE_COLOUR = "#55a868", "#4c72b0"
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"


@dataclass(frozen=True)
class Panel:
    """One histogram: the bins' edges on the score axis, each bin's count, its ticks."""

    title: list[str]  # one or two lines
    edges: list[float]  # len(counts) + 1, increasing
    counts: list[int]
    xticks: list[float]
    xlabel: str
    colour: str


def total_bins(totals: list[float], maxp: float) -> tuple[list[float], list[int]]:
    """Edges and counts of the totals' histogram (see the module's docstring)."""
    top = maxp if maxp > 0 else 1.0
    nb = min(max(math.ceil(top), 1), MAX_TOTAL_BINS)
    width = top / nb
    counts = [0] * nb
    for t in totals:
        counts[min(max(int(t // width), 0), nb - 1)] += 1
    return [k * width for k in range(nb + 1)], counts


def score_bins(scores: list[float], points: int) -> tuple[list[float], list[int]]:
    """Edges and counts of an exercise's histogram: one bin per whole point, 0..points."""
    counts = [0] * (points + 1)
    for s in scores:
        counts[min(max(math.floor(s + 0.5), 0), points)] += 1
    return [k - 0.5 for k in range(points + 2)], counts


def nice_step(span: float, most: int = 6) -> float:
    """A step of 1, 2 or 5 times a power of ten giving at most ``most`` intervals over ``span``."""
    if span <= 0:
        return 1.0
    raw = span / most
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _num(x: float) -> str:
    return f"{x:g}"


def _panel_svg(p: Panel, x0: float, y0: float, w: float, h: float) -> list[str]:
    left, top, right, bottom = PLOT
    ax_x, ax_y, ax_w, ax_h = x0 + left, y0 + top, w - left - right, h - top - bottom
    lo, hi = p.edges[0], p.edges[-1]
    ymax = max(p.counts, default=0)
    ystep = max(1, int(nice_step(max(ymax, 1), 5)))  # students are counted in whole numbers
    ytop = max(ystep, math.ceil(max(ymax, 1) / ystep) * ystep)

    def sx(v: float) -> float:
        return ax_x + (v - lo) / (hi - lo) * ax_w

    def sy(c: float) -> float:
        return ax_y + ax_h - c / ytop * ax_h

    out = ['<g class="panel">']
    for k, line in enumerate(p.title):
        out.append(f'<text class="title" x="{x0 + w / 2:.1f}" y="{y0 + 16 + 14 * k:.1f}" text-anchor="middle" '
                   f'font-size="11">{escape(line)}</text>')
    for c in range(0, ytop + 1, ystep):  # horizontal grid and the count axis
        y = sy(c)
        out.append(f'<line x1="{ax_x:.1f}" y1="{y:.1f}" x2="{ax_x + ax_w:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{ax_x - 4:.1f}" y="{y + 3.5:.1f}" text-anchor="end" font-size="9">{c}</text>')
    for k, c in enumerate(p.counts):
        if c:
            a, b = sx(p.edges[k]), sx(p.edges[k + 1])
            pad = (b - a) * 0.075
            out.append(f'<rect class="bar" data-lo="{_num(p.edges[k])}" data-count="{c}" x="{a + pad:.2f}" '
                       f'y="{sy(c):.2f}" width="{b - a - 2 * pad:.2f}" height="{sy(0) - sy(c):.2f}" '
                       f'fill="{p.colour}"><title>{c}</title></rect>')
    out.append(f'<rect x="{ax_x:.1f}" y="{ax_y:.1f}" width="{ax_w:.1f}" height="{ax_h:.1f}" fill="none" '
               f'stroke="#444"/>')
    for v in p.xticks:
        x = sx(v)
        out.append(f'<line x1="{x:.1f}" y1="{ax_y + ax_h:.1f}" x2="{x:.1f}" y2="{ax_y + ax_h + 4:.1f}" stroke="#444"/>')
        out.append(f'<text x="{x:.1f}" y="{ax_y + ax_h + 14:.1f}" text-anchor="middle" font-size="9">{_num(v)}</text>')
    out.append(f'<text x="{ax_x + ax_w / 2:.1f}" y="{y0 + h - 6:.1f}" text-anchor="middle" font-size="10">'
               f'{escape(p.xlabel)}</text>')
    out.append(f'<text x="{x0 + 12:.1f}" y="{ax_y + ax_h / 2:.1f}" text-anchor="middle" font-size="10" '
               f'transform="rotate(-90 {x0 + 12:.1f} {ax_y + ax_h / 2:.1f})">students</text>')
    out.append("</g>")
    return out


def class_histograms(totals: list[float], maxp: float, exercises: list[tuple[str, str, int, list[float]]]) -> str:
    """The figure as an SVG document.

    ``totals``: each student's total; ``exercises``: (id, title, points,
    each student's score) in the report's order.
    """
    n = len(totals)
    edges, counts = total_bins(totals, maxp)
    step = nice_step(edges[-1], 10)
    ticks = [k * step for k in range(int(edges[-1] / step + 1e-9) + 1)]
    panels = [Panel([f"Totals ({n} students, out of {_num(maxp)} points)"], edges, counts, ticks,
                    "total points", TOTALS_COLOUR)]
    for ex_id, title, points, scores in exercises:
        e_edges, e_counts = score_bins(scores, points)
        lines = textwrap.wrap(f"{ex_id}: {title}", TITLE_CHARS, max_lines=2, placeholder="...")
        every = max(1, int(nice_step(points, 8)))
        panels.append(Panel(lines, e_edges, e_counts, list(range(0, points + 1, every)), "score",
                            EXERCISE_COLOUR))
    cols = max(1, min(len(exercises), COLS))
    rows = (len(exercises) + cols - 1) // cols
    width, height = cols * PANEL_W, (rows + 1) * PANEL_H
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="{FONT}" fill="#222">',
           "<title>Totals and per-exercise scores</title>",
           f'<rect width="{width}" height="{height}" fill="white"/>']
    out += _panel_svg(panels[0], 0, 0, width, PANEL_H)
    for k, p in enumerate(panels[1:]):
        out += _panel_svg(p, (k % cols) * PANEL_W, (1 + k // cols) * PANEL_H, PANEL_W, PANEL_H)
    out.append("</svg>")
    return "\n".join(out) + "\n"
