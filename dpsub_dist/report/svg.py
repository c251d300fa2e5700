"""Inline SVG charts for the report pages: no plotting library, no fonts or files fetched.

Each chart is one ``<svg>`` element with a ``<title>``, sized in CSS pixels, whose numbers
are the values passed in (formatted by :func:`number`); axes carry no computed tick values.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH = 640
ROW = 24
PALETTE = ("#1f6fb4", "#e07b1a", "#2e9b47", "#c0392b", "#7d4fb0", "#8c564b", "#d35fb7")
FLAG = "#c0392b"


def number(value: float) -> str:
    """A value as shown on the pages: 4 significant digits (tests read them back)."""
    return f"{value:.4g}"


def _svg(height: int, title: str, body: str, kind: str) -> str:
    return (
        f'<svg class="chart {kind}" role="img" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(title)}</title>{body}</svg>"
    )


def bars(
    title: str, labels: Sequence[str], values: Sequence[float], color: str = PALETTE[0]
) -> str:
    """Horizontal bars, one per label, each with its value written at its end."""
    top, left, right = 28, 190, 90
    span = WIDTH - left - right
    largest = max([v for v in values if v > 0], default=1.0)
    parts = [f'<text x="0" y="16" class="ctitle">{escape(title)}</text>']
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        y = top + i * ROW
        length = max(span * value / largest, 1.0 if value > 0 else 0.0)
        parts.append(
            f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">{escape(label)}</text>'
            f'<rect class="bar" x="{left}" y="{y + 3}" width="{length:.1f}" height="{ROW - 6}" '
            f'fill="{color}"/>'
            f'<text x="{left + length + 6:.1f}" y="{y + 15}">{number(value)}</text>'
        )
    return _svg(top + ROW * len(values) + 8, title, "".join(parts), "bars")


def scree(title: str, ratios: Sequence[float], noise: float | None, noise_label: str = "") -> str:
    """Explained-variance ratio per component (bars), and a dashed line at ``noise``."""
    top, bottom, left, height = 48, 30, 40, 280
    span = WIDTH - left - 20
    plot = height - top - bottom
    largest = max([*ratios, noise or 0.0, 1e-12])
    step = span / max(len(ratios), 1)
    parts = [
        f'<text x="0" y="16" class="ctitle">{escape(title)}</text>',
        f'<line x1="{left}" y1="{top + plot}" x2="{WIDTH - 20}" y2="{top + plot}" stroke="#555"/>',
    ]
    for i, ratio in enumerate(ratios):
        h = max(plot * ratio / largest, 1.0)
        x = left + i * step + step * 0.15
        parts.append(
            f'<rect class="bar" x="{x:.1f}" y="{top + plot - h:.1f}" width="{step * 0.7:.1f}" '
            f'height="{h:.1f}" fill="{PALETTE[0]}"/>'
            f'<text x="{x + step * 0.35:.1f}" y="{top + plot - h - 4:.1f}" '
            f'text-anchor="middle">{number(ratio)}</text>'
            f'<text x="{x + step * 0.35:.1f}" y="{top + plot + 18}" '
            f'text-anchor="middle">PC{i + 1}</text>'
        )
    if noise is not None:
        y = top + plot - plot * noise / largest
        parts.append(
            f'<line class="noise" x1="{left}" y1="{y:.1f}" x2="{WIDTH - 20}" y2="{y:.1f}" '
            f'stroke="{FLAG}" stroke-width="2" stroke-dasharray="6 4"/>'
            f'<text class="flagtext" x="{WIDTH - 20}" y="16" text-anchor="end">'
            f"- - - {escape(noise_label)}</text>"
        )
    return _svg(height, title, "".join(parts), "scree")


def lines(
    title: str,
    series: dict[str, list[tuple[float, float]]],
    x_labels: tuple[str, str],
    y_range: tuple[float, float],
    y_labels: tuple[str, str],
    flagged: dict[str, list[bool]] | None = None,
    steps: bool = False,
) -> str:
    """One polyline per series (x, y), with a legend; flagged points drawn red. ``steps``:
    a value holds until the next point, and every series runs on to the last x of all.

    The axes are labelled only at their ends (``x_labels``, ``y_labels``), with text the
    caller chose, so no tick value is computed here.
    """
    top, left, bottom = 28, 70, 40
    legend = ROW * len(series)
    height = 240 + legend
    plot_h, plot_w = 240 - top - bottom, WIDTH - left - 20
    xs = [x for points in series.values() for x, _ in points] or [0.0]
    x0, x1 = min(xs), max(xs)
    y0, y1 = y_range

    def at(x: float, y: float) -> tuple[float, float]:
        fx = 0.5 if x1 == x0 else (x - x0) / (x1 - x0)
        fy = 0.5 if y1 == y0 else (y - y0) / (y1 - y0)
        return left + fx * plot_w, top + plot_h - fy * plot_h

    parts = [
        f'<text x="0" y="16" class="ctitle">{escape(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="#bbb"/>',
        f'<text x="{left - 6}" y="{top + 10}" text-anchor="end">{escape(y_labels[1])}</text>',
        f'<text x="{left - 6}" y="{top + plot_h}" text-anchor="end">{escape(y_labels[0])}</text>',
        f'<text x="{left}" y="{top + plot_h + 16}">{escape(x_labels[0])}</text>',
        f'<text x="{left + plot_w}" y="{top + plot_h + 16}" text-anchor="end">'
        f"{escape(x_labels[1])}</text>",
    ]
    for i, (name, points) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        xy = [at(x, y) for x, y in points]
        drawn = xy
        if steps and xy:
            drawn = [xy[0]]
            for x, y in [*xy[1:], (left + plot_w, xy[-1][1])]:
                drawn += [(x, drawn[-1][1]), (x, y)]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in drawn)
        parts.append(
            f'<polyline class="series" points="{path}" fill="none" stroke="{color}" '
            'stroke-width="2.5"/>'
        )
        marks = (flagged or {}).get(name, [False] * len(xy))
        for (x, y), flag in zip(xy, marks, strict=True):
            fill, r = (FLAG, 6) if flag else (color, 3.5)
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{fill}"/>')
        ly = 240 + i * ROW
        parts.append(
            f'<rect x="{left}" y="{ly}" width="14" height="14" fill="{color}"/>'
            f'<text x="{left + 20}" y="{ly + 12}">{escape(name)}</text>'
        )
    return _svg(height, title, "".join(parts), "lines")


def heatmap(
    title: str,
    row_labels: Sequence[str],
    column_labels: Sequence[str],
    values: Sequence[Sequence[float]],
) -> str:
    """A labelled grid, one cell per (row, column): blue for positive values, orange for
    negative ones, the deeper the larger ``|value|`` (relative to the largest); each cell
    carries its value, written in it."""
    top, left, cell_w = 48, 190, min(110, (WIDTH - 190 - 20) // max(len(column_labels), 1))
    largest = max([abs(v) for row in values for v in row], default=1.0) or 1.0
    parts = [f'<text x="0" y="16" class="ctitle">{escape(title)}</text>']
    for j, label in enumerate(column_labels):
        x = left + j * cell_w + cell_w / 2
        parts.append(f'<text x="{x:.1f}" y="{top - 8}" text-anchor="middle">{escape(label)}</text>')
    for i, (label, row) in enumerate(zip(row_labels, values, strict=True)):
        y = top + i * ROW
        parts.append(f'<text x="{left - 8}" y="{y + 16}" text-anchor="end">{escape(label)}</text>')
        for j, value in enumerate(row):
            color = PALETTE[0] if value >= 0 else PALETTE[1]
            x = left + j * cell_w
            parts.append(
                f'<rect class="cell" x="{x}" y="{y + 1}" width="{cell_w - 2}" height="{ROW - 2}" '
                f'fill="{color}" fill-opacity="{abs(value) / largest:.3f}"/>'
                f'<text x="{x + cell_w / 2:.1f}" y="{y + 16}" text-anchor="middle">'
                f"{number(value)}</text>"
            )
    return _svg(top + ROW * len(values) + 8, title, "".join(parts), "heatmap")
