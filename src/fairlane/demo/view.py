"""What the demo shows: the live view of a run, progress lines, and the side-by-side report.

This module owns the demo's terminal output, built with Rich from the figures of
:mod:`fairlane.demo.stats`; it computes nothing itself and does no I/O but printing.

* :func:`live_view`: a run as it happens (refreshed twice a second under ``rich.live``):
  each lane's busy slots, and per tenant and class what is queued, running, done and
  rejected, its start delays and its share of the lane's capacity;
* :func:`progress_line`: the same in one line, for logs and terminals without a cursor;
* :func:`comparison_table` and :func:`admission_table`: the fair run beside the FIFO one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from fairlane.demo.stats import LaneFigures, RowFigures, Snapshot

__all__ = [
    "MODE_TITLES",
    "admission_table",
    "comparison_table",
    "fmt_ms",
    "live_view",
    "progress_line",
    "summary_lines",
]

MODE_TITLES = {
    "fair": "fair run: fair dispatch, service classes and admission on",
    "fifo": "FIFO run: every job as one tenant in one class, no admission",
}


def fmt_ms(value: float | None, *, censored: bool = False) -> str:
    """``12 ms``, ``3.4 s``; ``-`` for no value; ``>=`` when a lower bound."""
    if value is None:
        return "-"
    text = f"{value:.0f} ms" if value < 1000 else f"{value / 1000:.1f} s"
    return f">={text}" if censored else text


def _pct(value: float) -> str:
    return f"{100 * value:.0f}%"


def _where(row: RowFigures) -> str:
    return f"{row.key.lane}/{row.key.service_class}"


def _lane_line(lane: LaneFigures) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=12)
    grid.add_column(width=24)
    grid.add_column()
    capacity = max(lane.capacity, 1)
    busy = lane.busy
    classes = ", ".join(f"{name} {n}" for name, n in sorted(lane.in_flight.items()) if n)
    waiting = sum(lane.waiting.values())
    grid.add_row(
        Text(f"lane {lane.lane}", style="bold"),
        ProgressBar(total=capacity, completed=min(busy, capacity), width=24),
        f"{busy:>2}/{lane.capacity} slots busy ({classes or 'idle'}); {waiting} waiting; "
        f"average use {_pct(lane.utilisation)}",
    )
    return grid


def live_view(snap: Snapshot) -> RenderableType:
    """The live view of a run."""
    phase = (
        f"arrivals until {snap.window:.0f} s"
        if snap.submitting
        else f"arrivals over; draining, {snap.jobs - snap.final} jobs left"
    )
    head = Text.assemble(
        ("Fairlane demo ", "bold"),
        (f"- {MODE_TITLES.get(snap.mode, snap.mode)}\n", "cyan"),
        f"{snap.elapsed:5.1f} s of {snap.seconds:.0f} s ({phase}); app {snap.app}",
    )
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name, justify in (
        ("tenant", "left"),
        ("lane/class", "left"),
        ("weight", "right"),
        ("sent", "right"),
        ("queued", "right"),
        ("deferred", "right"),
        ("running", "right"),
        ("done", "right"),
        ("rejected", "right"),
        ("p50 wait", "right"),
        ("p99 wait", "right"),
        ("oldest queued", "right"),
        ("share", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in snap.rows:
        table.add_row(
            row.key.tenant,
            _where(row),
            "-" if row.weight is None else f"{row.weight:g}",
            str(row.sent),
            str(row.queued - row.deferred_now),
            str(row.deferred_now) if row.deferred_now else "",
            str(row.running),
            str(row.done),
            str(row.rejected) if row.rejected else "",
            fmt_ms(row.p50_ms),
            fmt_ms(row.p99_ms),
            fmt_ms(row.oldest_waiting_ms),
            _pct(row.share),
        )
    return Group(head, *(_lane_line(lane) for lane in snap.lanes), table)


def _group_p99(rows: Sequence[RowFigures], prefix: str) -> str:
    values = [r.p99_ms for r in rows if r.key.tenant.startswith(prefix) and r.p99_ms is not None]
    return fmt_ms(max(values)) if values else "-"


def progress_line(snap: Snapshot) -> str:
    """A run's state in one line (for CI logs and terminals that are not TTYs)."""
    total = {
        "sent": sum(r.sent for r in snap.rows),
        "queued": sum(r.queued for r in snap.rows),
        "running": sum(r.running for r in snap.rows),
        "done": sum(r.done for r in snap.rows),
        "rejected": sum(r.rejected for r in snap.rows),
    }
    lanes = " ".join(f"{lane.lane} {lane.busy}/{lane.capacity}" for lane in snap.lanes)
    counts = " ".join(f"{k} {v}" for k, v in total.items())
    return (
        f"[{snap.mode:<4} {snap.elapsed:5.1f}s] {counts}; busy {lanes}; worst p99 wait: "
        f"flood {_group_p99(snap.rows, 'flood')}, steady {_group_p99(snap.rows, 'steady-')}, "
        f"interactive {_group_p99(snap.rows, 'interactive')}"
    )


def comparison_table(fair: Snapshot, fifo: Snapshot | None) -> Table:
    """Each row's start delays and share of its lane's capacity: fair, then FIFO."""
    both = fifo is not None
    title = "Start delay per tenant (due -> started, server clock)" + (
        ": fair / FIFO" if both else ""
    )
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("tenant")
    table.add_column("lane/class")
    table.add_column("weight", justify="right")
    table.add_column("jobs", justify="right")
    for name in ("p50", "p99", "max", "share"):
        table.add_column(name, justify="right")
    fifo_rows = {r.key: r for r in fifo.rows} if fifo is not None else {}
    for row in fair.rows:
        pair = [row] + ([fifo_rows[row.key]] if row.key in fifo_rows else [])
        if not any(r.sent for r in pair):
            continue
        cells = [
            row.key.tenant,
            _where(row),
            "-" if row.weight is None else f"{row.weight:g}",
            str(row.sent),
        ]
        for attr in ("p50_ms", "p99_ms", "max_ms"):
            cells.append(
                " / ".join(fmt_ms(getattr(r, attr), censored=r.censored > 0) for r in pair)
            )
        cells.append(" / ".join(_pct(r.share) for r in pair))
        table.add_row(*cells)
    return table


def admission_table(fair: Snapshot) -> Table:
    """What admission answered in the fair run, per row that met more than acceptance."""
    table = Table(
        title="Admission answers in the fair run", title_justify="left", header_style="bold"
    )
    for name in ("tenant", "lane/class", "accepted", "deferred", "rejected", "reasons"):
        table.add_column(name, justify="left" if name in ("tenant", "lane/class") else "right")
    table.add_column("Retry-After", justify="right")
    table.add_column("gave up", justify="right")
    for row in fair.rows:
        if not (row.rejected or row.deferred):
            continue
        reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(row.reasons.items()))
        after = "-"
        if row.retry_after is not None:
            after = f"{row.retry_after[0]:.1f}-{row.retry_after[1]:.1f} s"
        table.add_row(
            row.key.tenant,
            _where(row),
            str(row.accepted),
            str(row.deferred),
            str(row.rejected),
            reasons,
            after,
            str(row.gave_up),
        )
    return table


def summary_lines(groups: dict[str, dict[str, Any]]) -> list[str]:
    """One line per group of tenants: its start delays under each run."""
    lines = []
    for name, runs in groups.items():
        parts = []
        for mode, figures in runs.items():
            label = "fair" if mode == "fair" else "FIFO"
            parts.append(
                f"{label} p50 {fmt_ms(figures['p50'])}, p99 {fmt_ms(figures['p99'])}, "
                f"max {fmt_ms(figures['max'])}"
            )
        lines.append(f"{name}: " + "; ".join(parts))
    return lines
