"""SVG charts of a comparison (``fairlane.sim.svg``).

This module owns the charts ``--chart PATH.svg`` writes:

* ``PATH.svg`` -- p99 start delay per tenant group (then per class), one bar series
  per variant, on a logarithmic axis (a delay of 0 is drawn at 1 ms) since a plain
  FIFO's tail is often orders of magnitude above a fair queue's;
* ``PATH-queue.svg`` (the stem plus ``-queue``) -- jobs queued (admitted, not started)
  over time, one line per variant, from the engine's samples.
"""

from __future__ import annotations

import math
from pathlib import Path

from fairlane.sim.runner import Comparison
from fairlane.sim.svg import bar_chart, line_chart

__all__ = ["queue_chart_path", "write_charts"]

_FLOOR = 1e-3  # seconds: where a zero delay is drawn on the log axis
_MAX_POINTS = 400


def queue_chart_path(path: Path) -> Path:
    return path.with_name(f"{path.stem}-queue{path.suffix or '.svg'}")


def _p99(x: float) -> float:
    return _FLOOR if math.isnan(x) or x < _FLOOR else x


def write_charts(comparison: Comparison, path: Path) -> list[Path]:
    """Write both charts; returns the paths written."""
    results = comparison.results
    name = comparison.scenario.name
    groups = [g.name for g in results[0].groups] if results else []
    classes = [f"class {c.name}" for c in results[0].classes] if results else []
    bars: dict[str, list[float]] = {
        r.label: [_p99(g.waits.p99) for g in r.groups] + [_p99(c.waits.p99) for c in r.classes]
        for r in results
    }
    path.write_text(
        bar_chart(
            f"{name}: p99 start delay (s), by group and class",
            groups + classes,
            bars,
            y_title="seconds (log)",
            log=True,
        )
    )
    lines = {
        r.label: [(t, q) for t, q, _, _ in r.series[:: max(1, len(r.series) // _MAX_POINTS)]]
        for r in results
    }
    queue_path = queue_chart_path(path)
    queue_path.write_text(
        line_chart(
            f"{name}: jobs queued over time", lines, x_title="time (s)", y_title="queued jobs"
        )
    )
    return [path, queue_path]
