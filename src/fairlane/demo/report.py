"""The demo's report files: ``demo-report.json`` and the chart ``demo-report.svg``.

This module owns what the demo leaves on disk. The JSON holds the settings, each run's
figures per tenant (admission answers, start delays, shares of capacity), each lane's
use, the workflow runs and the pooled figures of groups of tenants; the SVG
(``fairlane.sim.svg``) shows each tenant's p50 and p99 start delay in the fair run beside the FIFO
run, on a logarithmic scale, since the two differ by orders of magnitude.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fairlane.demo.stats import Snapshot
from fairlane.sim.svg import bar_chart

__all__ = ["JSON_NAME", "SVG_NAME", "RunReport", "write_json", "write_svg"]

JSON_NAME = "demo-report.json"
SVG_NAME = "demo-report.svg"
_FLOOR_MS = 1.0  # a log scale has no zero: shorter delays are drawn at 1 ms


@dataclass(frozen=True, slots=True)
class RunReport:
    """One run's figures, as the report keeps them."""

    snapshot: Snapshot
    groups: dict[str, dict[str, Any]]
    workflows: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        snap = self.snapshot
        return {
            "mode": snap.mode,
            "app": snap.app,
            "elapsed_s": round(snap.elapsed, 3),
            "arrival_window_s": round(snap.window, 3),
            "jobs": snap.jobs,
            "lanes": [lane.as_json() for lane in snap.lanes],
            "tenants": [row.as_json() for row in snap.rows],
            "groups": self.groups,
            "workflows": self.workflows,
        }


def write_json(path: Path, settings: Mapping[str, Any], runs: Mapping[str, RunReport]) -> None:
    fair, fifo = runs.get("fair"), runs.get("fifo")
    comparison = []
    if fair is not None:
        fifo_rows = {r.key: r for r in fifo.snapshot.rows} if fifo is not None else {}
        for row in fair.snapshot.rows:
            entry: dict[str, Any] = {
                "tenant": row.key.tenant,
                "lane": row.key.lane,
                "class": row.key.service_class,
                "weight": row.weight,
                "fair": {"p50_ms": row.p50_ms, "p99_ms": row.p99_ms, "max_ms": row.max_ms},
            }
            other = fifo_rows.get(row.key)
            if other is not None:
                entry["fifo"] = {
                    "p50_ms": other.p50_ms,
                    "p99_ms": other.p99_ms,
                    "max_ms": other.max_ms,
                }
            comparison.append(entry)
    document = {
        "fairlane_demo_report": 1,
        "settings": dict(settings),
        "runs": {mode: run.as_json() for mode, run in runs.items()},
        "comparison": comparison,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")


def write_svg(path: Path, runs: Mapping[str, RunReport]) -> None:
    """Grouped bars: each tenant's p50 and p99 start delay, per run (log scale, ms)."""
    fair = runs.get("fair")
    if fair is None:
        raise ValueError("the chart needs the fair run")
    rows = [r for r in fair.snapshot.rows if r.sent]
    categories = [f"{r.key.tenant} ({r.key.lane}/{r.key.service_class})" for r in rows]
    series: dict[str, list[float | None]] = {}
    for mode, label in (("fair", "fair"), ("fifo", "FIFO")):
        run = runs.get(mode)
        if run is None:
            continue
        by_key = {r.key: r for r in run.snapshot.rows}
        for what in ("p50", "p99"):
            values: list[float | None] = []
            for row in rows:
                other = by_key.get(row.key)
                value = None if other is None else getattr(other, f"{what}_ms")
                values.append(None if value is None else max(_FLOOR_MS, float(value)))
            series[f"{what} {label}"] = values
    svg = bar_chart(
        "Start delay per tenant: fair dispatch vs FIFO (ms, log scale)",
        categories,
        series,
        y_title="start delay (ms)",
        log=True,
    )
    path.write_text(svg)
