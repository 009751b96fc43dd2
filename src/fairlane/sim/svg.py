"""Self-contained SVG charts for the demo's and the simulator's reports.

Grouped bar charts (linear or logarithmic) and line charts of (x, y) series, written
as plain SVG text: no script, no fonts or styles fetched from elsewhere, viewable in
any browser. Written here rather
than taken from a plotting library: the light pure-Python one installs an import hook
that warns on every failed import in the process that loads it (an error under
``-W error``), and the full plotting stacks are far heavier than two kinds of bars.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

__all__ = ["bar_chart", "line_chart"]

_PALETTE = ("#3b6fb6", "#9ec3ea", "#c8553d", "#f2a488", "#4f9d69", "#a8d5b5", "#7d5ba6")
_WIDTH, _HEIGHT = 1000, 540
_LEFT, _RIGHT, _TOP, _BOTTOM = 80, 20, 50, 170


def bar_chart(
    title: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float | None]] | Mapping[str, Sequence[float]],
    *,
    y_title: str = "",
    log: bool = False,
) -> str:
    """An SVG document: one group of bars per category, one bar per series.

    ``None`` leaves a gap. On a log scale values are floored at the smallest positive
    value shown, so zero still draws a (minimal) bar.
    """
    for name, values in series.items():
        if len(values) != len(categories):
            raise ValueError(f"series {name!r} has {len(values)} values for {len(categories)}")
    shown = [v for values in series.values() for v in values if v is not None]
    scale = _Scale(shown, log=log)
    plot_w = _WIDTH - _LEFT - _RIGHT
    plot_h = _HEIGHT - _TOP - _BOTTOM
    parts = _frame(title, y_title, scale, plot_w, plot_h)
    group_w = plot_w / max(1, len(categories))
    bar_w = group_w * 0.8 / max(1, len(series))
    for i, category in enumerate(categories):
        x0 = _LEFT + i * group_w + group_w * 0.1
        for j, values in enumerate(series.values()):
            value = values[i]
            if value is None:
                continue
            height = plot_h * scale.fraction(value)
            parts.append(
                f'<rect x="{x0 + j * bar_w:.1f}" y="{_TOP + plot_h - height:.1f}" '
                f'width="{bar_w * 0.95:.1f}" height="{height:.1f}" '
                f'fill="{_PALETTE[j % len(_PALETTE)]}"><title>{escape(category)}: '
                f"{_label(value)}</title></rect>"
            )
        cx, cy = x0 + group_w * 0.4, _TOP + plot_h + 12
        parts.append(
            f'<text x="{cx:.1f}" y="{cy}" text-anchor="end" '
            f'transform="rotate(-35 {cx:.1f} {cy})">{escape(category)}</text>'
        )
    parts.extend(_legend(list(series)))
    parts.append("</svg>")
    return "\n".join(parts)


def line_chart(
    title: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    x_title: str = "",
    y_title: str = "",
) -> str:
    """An SVG document: one polyline per series of (x, y) points, linear axes from 0."""
    xs = [x for points in series.values() for x, _ in points]
    ys = [y for points in series.values() for _, y in points]
    x_scale, y_scale = _Scale(xs, log=False), _Scale(ys, log=False)
    plot_w = _WIDTH - _LEFT - _RIGHT
    plot_h = _HEIGHT - _TOP - _BOTTOM
    parts = _frame(title, y_title, y_scale, plot_w, plot_h)
    for tick in x_scale.ticks():
        x = _LEFT + plot_w * x_scale.fraction(tick)
        parts.append(
            f'<text x="{x:.1f}" y="{_TOP + plot_h + 18}" text-anchor="middle">{_label(tick)}</text>'
        )
    parts.append(
        f'<text x="{_LEFT + plot_w / 2}" y="{_TOP + plot_h + 40}" '
        f'text-anchor="middle">{escape(x_title)}</text>'
    )
    for j, points in enumerate(series.values()):
        coords = " ".join(
            f"{_LEFT + plot_w * x_scale.fraction(x):.1f},"
            f"{_TOP + plot_h * (1 - y_scale.fraction(y)):.1f}"
            for x, y in points
        )
        parts.append(
            f'<polyline points="{coords}" fill="none" stroke-width="1.5" '
            f'stroke="{_PALETTE[(2 * j) % len(_PALETTE)]}"/>'
        )
    parts.extend(_legend(list(series), step=2))
    parts.append("</svg>")
    return "\n".join(parts)


def _frame(title: str, y_title: str, scale: _Scale, plot_w: float, plot_h: float) -> list[str]:
    """The document's start: background, title, y axis title, grid lines and labels."""
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" '
        f'viewBox="0 0 {_WIDTH} {_HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{_WIDTH}" height="{_HEIGHT}" fill="white"/>',
        f'<text x="{_WIDTH / 2}" y="24" text-anchor="middle" font-size="16">{escape(title)}</text>',
        f'<text x="16" y="{_TOP + plot_h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {_TOP + plot_h / 2})">{escape(y_title)}</text>',
    ]
    for tick in scale.ticks():
        y = _TOP + plot_h * (1 - scale.fraction(tick))
        parts.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_label(tick)}</text>'
        )
    parts.append(
        f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{_TOP + plot_h}" '
        f'y2="{_TOP + plot_h}" stroke="#333"/>'
    )
    return parts


def _legend(names: Sequence[str], *, step: int = 1) -> list[str]:
    parts = []
    for j, name in enumerate(names):
        x, y = _LEFT + j * 150, _HEIGHT - 16
        parts.append(
            f'<rect x="{x}" y="{y - 10}" width="12" height="12" '
            f'fill="{_PALETTE[(step * j) % len(_PALETTE)]}"/>'
            f'<text x="{x + 18}" y="{y}">{escape(name)}</text>'
        )
    return parts


class _Scale:
    """Where a value falls on the y axis, from 0 (bottom) to 1 (top)."""

    def __init__(self, values: Sequence[float], *, log: bool) -> None:
        self.log = log
        top = max(values, default=1.0)
        if log:
            positive = [v for v in values if v > 0]
            self.low = math.pow(10.0, math.floor(math.log10(min(positive, default=1.0))))
            self.high = math.pow(10.0, math.ceil(math.log10(max(top, self.low * 10))))
        else:
            self.low, self.high = 0.0, _nice_ceiling(top if top > 0 else 1.0)

    def fraction(self, value: float) -> float:
        if self.log:
            v = max(value, self.low)
            return (math.log10(v) - math.log10(self.low)) / (
                math.log10(self.high) - math.log10(self.low)
            )
        return max(0.0, value) / self.high

    def ticks(self) -> list[float]:
        if self.log:
            lo, hi = round(math.log10(self.low)), round(math.log10(self.high))
            return [float(10.0**k) for k in range(lo, hi + 1)]
        return [self.high * k / 5 for k in range(6)]


def _nice_ceiling(value: float) -> float:
    magnitude = math.pow(10.0, math.floor(math.log10(value)))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if step * magnitude >= value:
            return step * magnitude
    return 10.0 * magnitude


def _label(value: float) -> str:
    if value >= 1000 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.3g}"
