"""Presenting a comparison: Rich tables for the terminal, and a JSON document.

This module owns the layout of the results, never their definition (that is
``fairlane.sim.metrics``). Tables: a summary per variant (jobs, rejections, deferrals,
the longest queue, utilisation, Jain's index), the gate's decisions by reason, start
delay per class (with
the p99 of each phase when the scenario has phases), start delay and shares per tenant
group, and each group's share per phase; with an upstream behind a key, per upstream:
the key's rate in force, calls, 429s as a share of calls, goodput against capacity,
Jain's index of the tenants' goodput, p99 completion, pushbacks, retries and failed
jobs, and per group its share of the upstream's goodput and its p99 completion.
Seconds are printed to three significant digits; ``-`` is "not applicable" (no jobs,
not backlogged).

JSON (``to_json``): ``{"scenario": {...}, "variants": [{"label", "settings",
"summary", "classes", "groups", "tenants", "upstreams", "series"}]}``, with every row's waits as
``{"jobs", "p50", "p99", "max"}`` in seconds; NaN is written as null, an unbounded
slice as ``"inf"``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fairlane.sim.metrics import Row, UpstreamRow, VariantResult
from fairlane.sim.runner import Comparison

__all__ = ["print_report", "secs", "to_json", "write_json"]


def secs(x: float | None) -> str:
    """Seconds to three significant digits, without exponents; ``-`` for none."""
    if x is None or math.isnan(x):
        return "-"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}" if x >= 0.001 or x == 0 else f"{x:.1e}"


def _pct(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _header(c: Comparison) -> str:
    s = c.scenario
    lanes = ", ".join(f"{lane.name} {lane.slots} slots" for lane in s.lanes)
    w0, w1 = c.results[0].window if c.results else (0.0, 0.0)
    scale = f", scale {c.scale:g}" if c.scale != 1 else ""
    return (
        f"[bold]{s.name}[/] -- {s.description}\n"
        f"seed {s.seed}{scale}; {s.tenant_count} tenants; {lanes}; "
        f"window [{w0:g}, {w1:g}] s"
    )


def summary_table(results: tuple[VariantResult, ...]) -> Table:
    table = Table(title="Summary", title_justify="left")
    for name in ("variant", "jobs", "done", "left", "rejected", "lost", "deferred",
                 "max queue", "max deferred", "utilisation", "Jain", "yields", "end (s)",
                 "wall (s)"):  # fmt: skip
        table.add_column(name, justify="left" if name == "variant" else "right")
    for r in results:
        util = ", ".join(_pct(u) for u in r.utilisation.values())
        table.add_row(
            r.label, str(r.submitted), str(r.completed), str(r.unfinished), str(r.rejected),
            str(r.lost), str(sum(r.deferrals.values())), str(r.max_queue), str(r.max_deferred),
            util, _ratio(r.jain), str(r.yields), f"{r.makespan:.1f}", f"{r.wall:.2f}",
        )  # fmt: skip
    return table


def reason_table(results: tuple[VariantResult, ...]) -> Table:
    """Rejections and deferrals by the gate's reason (each submission counted)."""
    rejections = sorted({k for r in results for k in r.rejections})
    deferrals = sorted({k for r in results for k in r.deferrals})
    table = Table(title="Admission by reason", title_justify="left")
    table.add_column("variant")
    for name in rejections:
        table.add_column(f"rejected {name}", justify="right")
    for name in deferrals:
        table.add_column(f"deferred {name}", justify="right")
    for r in results:
        table.add_row(
            r.label,
            *(str(r.rejections.get(k, 0)) for k in rejections),
            *(str(r.deferrals.get(k, 0)) for k in deferrals),
        )
    return table


def class_table(results: tuple[VariantResult, ...]) -> Table:
    phases = results[0].phases if results else ()
    table = Table(title="Start delay by class (s)", title_justify="left")
    for name in ("class", "variant", "jobs", "p50", "p99", "max", "Jain", "backlogged"):
        table.add_column(name, justify="left" if name in ("class", "variant") else "right")
    for phase in phases:
        table.add_column(f"p99 {phase}", justify="right")
    names = [c.name for c in results[0].classes] if results else []
    for i, name in enumerate(names):
        for r in results:
            c = r.classes[i]
            table.add_row(
                name, r.label, str(c.waits.jobs), secs(c.waits.p50), secs(c.waits.p99),
                secs(c.waits.max), _ratio(c.jain), str(c.backlogged),
                *(secs(x) for x in c.phase_p99),
            )  # fmt: skip
        table.add_section()
    return table


def _limit(row: Row) -> str:
    if row.limit is None:
        return "-"
    lo, hi = row.limit
    return f"{lo}-{hi}" if lo != hi else str(lo)


def group_table(results: tuple[VariantResult, ...], *, tenants: bool = False) -> Table:
    title = "Start delay and share by tenant" if tenants else "Start delay and share by group"
    table = Table(title=title + " (s)", title_justify="left")
    throttled = any(g.limit is not None or g.peak is not None for r in results for g in r.groups)
    columns = ["tenant" if tenants else "group", "class", "n", "weight", "variant", "jobs",
               "rejected", "p50", "p99", "max", "share", "fair share"]  # fmt: skip
    columns += ["limit", "peak"] if throttled else []
    keyed = any(g.handoffs is not None for r in results for g in r.groups)
    columns += ["hand-offs p50", "hand-offs p99"] if keyed else []
    for name in columns:
        left = name in ("group", "tenant", "class", "variant")
        table.add_column(name, justify="left" if left else "right")
    rows = [r.tenants if tenants else r.groups for r in results]
    for i in range(len(rows[0]) if rows else 0):
        for r, row_list in zip(results, rows, strict=True):
            g = row_list[i]
            cells = [
                g.name, g.service_class, str(g.tenants), f"{g.weight:g}", r.label,
                str(g.submitted), str(g.rejected), secs(g.waits.p50), secs(g.waits.p99),
                secs(g.waits.max), _pct(g.share), _pct(g.fair_share),
            ]  # fmt: skip
            if throttled:
                cells += [_limit(g), "-" if g.peak is None else str(g.peak)]
            if keyed:
                h = g.handoffs
                cells += [f"{h.p50:g}", f"{h.p99:g}"] if h is not None else ["-", "-"]
            table.add_row(*cells)
        table.add_section()
    return table


def phase_table(results: tuple[VariantResult, ...]) -> Table:
    phases = results[0].phases
    table = Table(title="Share of the class's service, by phase", title_justify="left")
    for name in ("group", "weight", "variant", *phases):
        table.add_column(name, justify="left" if name in ("group", "variant") else "right")
    for i in range(len(results[0].groups)):
        for r in results:
            g = r.groups[i]
            table.add_row(g.name, f"{g.weight:g}", r.label, *(_pct(x) for x in g.phase_shares))
        table.add_section()
    return table


def limit_table(results: tuple[VariantResult, ...]) -> Table:
    phases = results[0].phases
    table = Table(title="Concurrency limit in force, by phase", title_justify="left")
    for name in ("group", "variant", *phases):
        table.add_column(name, justify="left" if name in ("group", "variant") else "right")
    for i in range(len(results[0].groups)):
        rows = [(r, r.groups[i]) for r in results if r.groups[i].phase_limits]
        for r, g in rows:
            cells = [_limit(dataclasses.replace(g, limit=x)) for x in g.phase_limits]
            table.add_row(g.name, r.label, *cells)
        if rows:
            table.add_section()
    return table


def _rate(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f} {unit}/s" if x >= 100 else f"{x:.3g} {unit}/s"


def upstream_table(results: tuple[VariantResult, ...]) -> Table:
    """Per upstream and variant: what it served against its capacity, and how fairly."""
    table = Table(title="Upstreams (calls starting in the window)", title_justify="left")
    for name in ("key", "variant", "rate key", "capacity", "calls", "429s", "429 share",
                 "goodput", "of capacity", "Jain", "done p99", "pushbacks", "retries",
                 "failed", "adaptive limit"):  # fmt: skip
        table.add_column(
            name, justify="left" if name in ("key", "variant", "rate key") else "right"
        )
    count = len(results[0].upstreams) if results else 0
    for i in range(count):
        for r in results:
            u: UpstreamRow = r.upstreams[i]
            capacity = " + ".join(
                x for x in (_rate(u.capacity_calls, "calls"), _rate(u.capacity_tokens, "tokens"))
                if x != "-"
            )  # fmt: skip
            goodput = " + ".join(
                _rate(x, unit)
                for x, c, unit in ((u.goodput_calls, u.capacity_calls, "calls"),
                                   (u.goodput_tokens, u.capacity_tokens, "tokens"))
                if c
            )  # fmt: skip
            adaptive = "-" if u.limits is None else f"{u.limits[0]} (end {u.limits[1]})"
            table.add_row(
                u.key, r.label, u.rate, capacity, str(u.calls), str(u.throttled),
                _pct(u.share_429), goodput, _pct(u.goodput), _ratio(u.jain), secs(u.done.p99),
                str(u.pushbacks), str(u.retried), str(u.failed), adaptive,
            )  # fmt: skip
        table.add_section()
    return table


def upstream_groups(results: tuple[VariantResult, ...]) -> Table:
    """Per group: its share of its upstream's goodput and its completion times."""
    table = Table(title="Upstream goodput and completion by group (s)", title_justify="left")
    for name in ("group", "n", "weight", "variant", "jobs", "done", "failed", "share",
                 "fair share", "done p50", "done p99"):  # fmt: skip
        table.add_column(name, justify="left" if name in ("group", "variant") else "right")
    for i in range(len(results[0].groups) if results else 0):
        for r in results:
            g = r.groups[i]
            done = g.done
            table.add_row(
                g.name, str(g.tenants), f"{g.weight:g}", r.label, str(g.submitted),
                str(g.completed), str(g.failed), _pct(g.up_share), _pct(g.up_fair),
                secs(done.p50 if done else None), secs(done.p99 if done else None),
            )  # fmt: skip
        table.add_section()
    return table


def print_report(
    comparison: Comparison, console: Console, *, tenants: int = 0, max_groups: int = 40
) -> None:
    """The tables; per-tenant rows too when ``tenants`` >= the scenario's tenant count."""
    results = comparison.results
    console.print(_header(comparison))
    console.print(summary_table(results))
    if any(r.rejections or r.deferrals for r in results):
        console.print(reason_table(results))
    console.print(class_table(results))
    if results and len(results[0].groups) <= max_groups:
        console.print(group_table(results))
    if results and 0 < len(results[0].tenants) <= tenants:
        console.print(group_table(results, tenants=True))
    if results and results[0].upstreams:
        console.print(upstream_table(results))
        if len(results[0].groups) <= max_groups:
            console.print(upstream_groups(results))
    if results and results[0].phases and len(results[0].groups) <= max_groups:
        console.print(phase_table(results))
        if any(g.phase_limits for r in results for g in r.groups):
            console.print(limit_table(results))


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _slice(seconds: float) -> float | str:
    return "inf" if math.isinf(seconds) else seconds


def to_json(comparison: Comparison) -> dict[str, Any]:
    """The whole comparison as plain JSON-able data (see the module docstring)."""
    s = comparison.scenario
    variants = []
    for r in comparison.results:
        summary = {
            f.name: getattr(r, f.name)
            for f in dataclasses.fields(r)
            if f.name not in ("settings", "classes", "groups", "tenants", "series", "upstreams")
        }
        variants.append({
            "label": r.label,
            "settings": dataclasses.asdict(r.settings) | {"slice": _slice(r.settings.slice)},
            "summary": summary | {"rejected": r.rejected},
            "classes": [dataclasses.asdict(c) for c in r.classes],
            "groups": [dataclasses.asdict(g) for g in r.groups],
            "tenants": [dataclasses.asdict(t) for t in r.tenants],
            "upstreams": [dataclasses.asdict(u) for u in r.upstreams],
            "series": [list(x) for x in r.series],
        })  # fmt: skip
    scenario = {
        "name": s.name, "source": s.source, "description": s.description, "seed": s.seed,
        "scale": comparison.scale, "tenants": s.tenant_count, "horizon": s.horizon,
        "lanes": {lane.name: lane.slots for lane in s.lanes},
        "phases": [dataclasses.asdict(p) for p in s.phases],
    }  # fmt: skip
    return {"scenario": _plain(scenario), "variants": _plain(variants)}


def write_json(comparison: Comparison, path: Path) -> None:
    path.write_text(json.dumps(to_json(comparison), indent=1, allow_nan=False) + "\n")
