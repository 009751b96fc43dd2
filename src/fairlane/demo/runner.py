"""Running the demo: one workload, run fair and then FIFO, shown live, then reported.

This module owns the demo's control flow. :func:`run_demo` makes sure nothing outlives
it (:class:`fairlane.demo.fleet.Cleanup`), starts the private server unless given a URL,
and runs the async part on Fairlane's event loop. Each run (:func:`_one_run`) has its own
app name, hence its own keys: it connects, sets tenant weights (fair run), starts a
worker process per lane, waits until both lanes have their slots, and then, in one
``asyncio.TaskGroup``, submits the workload's arrivals on time (:mod:`fairlane.demo.submit`)
(honouring Retry-After) while a monitor reads the jobs' records twice a second and
refreshes the view; when every job has finished, or the run's time is up, it stops the
workers (SIGTERM, bounded wait, SIGKILL) and deletes the run's keys.

``--duration`` is the total: each run gets half of it (all of it with no baseline), 70 %
for arrivals and the rest to drain, plus up to half as much again if jobs are left.

With ``--dashboard-port`` each run also starts a ``fairlane gateway`` for its app on
that port (the dashboard at ``/ui``, Prometheus at ``/metrics``), with the run's workers
and stopped with them: the URL stays the same and always shows the run in progress,
and is closed between runs for the few seconds it takes to restart the fleet. With
``--metrics-port`` the workers serve their metrics (lane ``light`` on the port, lane
``heavy`` on the next one). Both are checked to be free before anything starts.
SIGTERM is handled as Ctrl-C: the runs stop, everything is cleaned up, and
``KeyboardInterrupt`` reaches the caller (the command exits 130).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from fairlane.app import App
from fairlane.demo.app import POOLS_TOML, Mode, build_app
from fairlane.demo.fleet import (
    LANES,
    Cleanup,
    DemoError,
    Fleet,
    GatewaySpec,
    PrivateServer,
    check_ports,
)
from fairlane.demo.report import JSON_NAME, SVG_NAME, RunReport, write_json, write_svg
from fairlane.demo.stats import RowKey, Snapshot, Tracker
from fairlane.demo.submit import FIFO_TENANT, Submitter
from fairlane.demo.view import (
    MODE_TITLES,
    admission_table,
    comparison_table,
    live_view,
    progress_line,
    summary_lines,
)
from fairlane.demo.workload import Workload, build_workload
from fairlane.runtime.loop import run as run_loop
from fairlane.store.api import redact_url

__all__ = ["FAIR_WEIGHTS", "GROUPS", "DemoOptions", "DemoResult", "run_demo"]

#: tenant weights in the fair run (others weigh 1); FIFO has one tenant
FAIR_WEIGHTS: dict[str, float] = {"interactive": 2.0, "research": 2.0}
#: tenants pooled in the summary
GROUPS: dict[str, Callable[[RowKey], bool]] = {
    "quiet tenants (steady-*, interactive)": lambda k: (
        k.tenant.startswith("steady-") or k.tenant == "interactive"
    ),
    "steady tenants": lambda k: k.tenant.startswith("steady-"),
    "interactive": lambda k: k.tenant == "interactive",
    "flood (lane light)": lambda k: k.tenant == "flood" and k.lane == "light",
    "lane heavy (flood renders, research slices)": lambda k: k.lane == "heavy",
    "batch": lambda k: k.tenant == "batch",
}
_REFRESH = 0.5  # s between reads of the store and refreshes of the view
_LINE_EVERY = 2.0  # s between progress lines without the live view
_CALL_TIMEOUT = 10.0  # s: any one call to the server
_CAPACITY_TIMEOUT = 30.0  # s for the workers to start and register their slots


@dataclass(frozen=True, slots=True)
class DemoOptions:
    duration: float = 60.0
    """Seconds of workload in all: each run gets half (all of it with no baseline)."""
    tenants: int = 5
    seed: int = 7
    redis_url: str | None = None
    baseline: bool = True
    out: Path = Path("fairlane-demo")
    live: bool | None = None
    """Live view (None: when the console is a terminal)."""
    dashboard_port: int | None = None
    """Serve the run's gateway (dashboard and /metrics) on this port (None: off)."""
    admin_key: str | None = field(default=None, repr=False)
    """The gateway's admin key (None: a random one, printed at the start)."""
    metrics_port: int | None = None
    """The workers' metrics ports: lane light on this one, lane heavy on the next."""

    @property
    def per_run(self) -> float:
        return self.duration / 2 if self.baseline else self.duration


@dataclass(frozen=True, slots=True)
class DemoResult:
    runs: dict[str, RunReport]
    json_path: Path
    svg_path: Path


def run_demo(options: DemoOptions, console: Console) -> DemoResult:
    """Run the demo and write its report; nothing it started outlives it."""
    check_ports(_ports(options))
    gateway = _gateway(options)
    with Cleanup() as cleanup:
        url = options.redis_url
        if url is None:
            server = PrivateServer()
            cleanup.server = server
            url = server.start()
            console.print(f"server: a private server at {url} (stopped at the end)")
        else:
            console.print(
                f"server: {redact_url(url)}; the demo's keys live under "
                "{fl:fldemo-...} and are deleted at the end"
            )
        cleanup.url = url
        _print_endpoints(options, gateway, console)
        return run_loop(_demo(options, console, url, cleanup, gateway))


def _ports(options: DemoOptions) -> dict[int, str]:
    ports: dict[int, str] = {}
    if options.dashboard_port is not None:
        ports[options.dashboard_port] = "--dashboard-port"
    if options.metrics_port is not None:
        for i, lane in enumerate(LANES):
            port = options.metrics_port + i
            if port in ports:
                raise DemoError(f"port {port} is asked for by --dashboard-port and --metrics-port")
            ports[port] = f"--metrics-port, lane {lane}"
    return ports


def _gateway(options: DemoOptions) -> GatewaySpec | None:
    if options.dashboard_port is None:
        return None
    key = options.admin_key or secrets.token_urlsafe(24)
    if len(key) < 16:
        raise DemoError("the admin key must be at least 16 characters")
    return GatewaySpec(options.dashboard_port, key)


def _print_endpoints(options: DemoOptions, gateway: GatewaySpec | None, console: Console) -> None:
    if gateway is not None:
        # a key the user chose is theirs to know; echoing it would only put it in logs
        key = "the one given" if options.admin_key else gateway.admin_key
        follows = (
            "; it follows the run in progress (down for a few seconds between runs)"
            if options.baseline
            else ""
        )
        console.print(f"dashboard: {gateway.url}/ui (admin key: {key}){follows}", markup=False)
        console.print(f"gateway metrics: {gateway.url}/metrics", markup=False)
    if options.metrics_port is not None:
        urls = ", ".join(
            f"http://127.0.0.1:{options.metrics_port + i}/metrics (lane {lane})"
            for i, lane in enumerate(LANES)
        )
        console.print(f"worker metrics: {urls}", markup=False)


async def _demo(
    options: DemoOptions,
    console: Console,
    url: str,
    cleanup: Cleanup,
    gateway: GatewaySpec | None,
) -> DemoResult:
    loop = asyncio.get_running_loop()
    forwarded = False
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        # SIGTERM stops the demo as Ctrl-C does (the event loop's runner turns SIGINT
        # into a cancellation of this coroutine, and then into KeyboardInterrupt)
        loop.add_signal_handler(signal.SIGTERM, os.kill, os.getpid(), signal.SIGINT)
        forwarded = True
    try:
        workload = build_workload(options.per_run, options.tenants, options.seed)
        steady = ", ".join(t for t in workload.tenants if t.startswith("steady-")) or "none"
        console.print(
            f"workload (seed {options.seed}): {len(workload.arrivals)} jobs per run from "
            f"{len(workload.tenants)} tenants -- a flood, steady tenants ({steady}), an "
            "interactive tenant, batch work and two research workflows"
        )
        console.print(
            f"each run: {options.per_run:g} s ({workload.window:.0f} s of arrivals, then "
            "draining); the same arrivals in every run"
        )
        token = secrets.token_hex(3)
        modes: list[Mode] = ["fair", "fifo"] if options.baseline else ["fair"]
        runs: dict[str, RunReport] = {}
        for mode in modes:
            name = f"fldemo-{token}-{mode}"
            runs[mode] = await _one_run(
                mode, name, url, workload, options, console, cleanup, gateway
            )
        return _report(options, workload, runs, console)
    finally:
        if forwarded:
            loop.remove_signal_handler(signal.SIGTERM)


async def _one_run(  # noqa: PLR0917 - one run's parts
    mode: Mode,
    name: str,
    url: str,
    workload: Workload,
    options: DemoOptions,
    console: Console,
    cleanup: Cleanup,
    gateway: GatewaySpec | None,
) -> RunReport:
    console.rule(MODE_TITLES[mode])
    app = build_app(name, mode, url)
    cleanup.apps.append(name)
    weights = dict(FAIR_WEIGHTS) if mode == "fair" else None
    rows = sorted(
        {RowKey(a.tenant, a.lane, a.service_class) for a in workload.arrivals},
        key=lambda k: (workload.tenants.index(k.tenant), k.lane != "light", k.service_class),
    )
    tracker = Tracker(
        mode=mode,
        app=name,
        seconds=workload.seconds,
        window=workload.window,
        lanes=LANES,
        rows=rows,
        weights=weights,
    )
    fleet = Fleet(name, mode, url, cleanup, options.metrics_port, gateway)
    async with app:
        try:
            if weights is not None:
                for tenant in workload.tenants:
                    await app.tenants.configure(tenant, weight=weights.get(tenant, 1.0))
            fleet.start()
            console.print(
                "workers: "
                + ", ".join(f"pid {w.pid} (lane {w.lane}, {w.slots} slots)" for w in fleet.workers)
            )
            await _wait_for_capacity(app, fleet)
            await fleet.wait_for_gateway()
            if gateway is not None and fleet.gateway is not None:
                console.print(
                    f"gateway: pid {fleet.gateway.pid}, app {name} at {gateway.url}/ui",
                    markup=False,
                )
            await _drive(app, mode, workload, tracker, fleet, options, console)
        finally:
            await fleet.stop(app.settings.worker.grace_period)
        snap = tracker.snapshot(final=True)
        workflows = _workflows(tracker)
        async with asyncio.timeout(_CALL_TIMEOUT * 3):
            await app.store.remove_keys()
        cleanup.apps.remove(name)
    console.print(
        f"{mode} run over after {snap.elapsed:.1f} s: {snap.jobs} jobs, "
        f"{sum(r.done for r in snap.rows)} done, {sum(r.rejected for r in snap.rows)} "
        f"rejections, {sum(r.queued + r.running for r in snap.rows)} unfinished; workers "
        "stopped, keys deleted"
    )
    groups = {label: tracker.group(pick) for label, pick in GROUPS.items()}
    return RunReport(snap, groups, workflows)


async def _wait_for_capacity(app: App, fleet: Fleet) -> None:
    """Until every lane counts its worker's slots (the workers are up and serving)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _CAPACITY_TIMEOUT
    while True:
        fleet.check()
        async with asyncio.timeout(_CALL_TIMEOUT):
            states = {lane: await app.store.lane_state(lane) for lane in LANES}
        if all(states[lane].capacity >= slots for lane, slots in LANES.items()):
            return
        if loop.time() >= deadline:
            raise DemoError(
                f"the workers did not register their slots within {_CAPACITY_TIMEOUT:g} s "
                f"({', '.join(f'{k}: {v.capacity}' for k, v in states.items())})"
            )
        await asyncio.sleep(0.1)


class _Display:
    """The live view, or a progress line every few seconds."""

    def __init__(self, console: Console, live: Live | None) -> None:
        self.console = console
        self.live = live
        self.next_line = 0.0

    def show(self, snap: Snapshot, *, last: bool = False) -> None:
        if self.live is not None:
            self.live.update(live_view(snap), refresh=True)
        elif last or snap.elapsed >= self.next_line:
            self.console.print(progress_line(snap), markup=False)
            self.next_line = snap.elapsed + _LINE_EVERY


async def _drive(  # noqa: PLR0917 - one run's parts
    app: App,
    mode: Mode,
    workload: Workload,
    tracker: Tracker,
    fleet: Fleet,
    options: DemoOptions,
    console: Console,
) -> None:
    """Submit the workload on time and watch it until it is done (or time is up)."""
    use_live = console.is_terminal if options.live is None else options.live
    live = Live(console=console, auto_refresh=False, transient=False) if use_live else None
    display = _Display(console, live)
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(_CALL_TIMEOUT):
        await tracker.poll(app.store)  # the run's start, on the server's clock
    t0 = loop.time()
    hard_stop = t0 + workload.seconds + max(5.0, workload.seconds / 2)
    submitted = asyncio.Event()
    with live if live is not None else contextlib.nullcontext():
        try:
            async with asyncio.TaskGroup() as group:
                submitter = Submitter(app, mode, tracker)
                group.create_task(submitter.submit_all(workload, t0, submitted))
                group.create_task(_monitor(app, tracker, fleet, display, submitted, hard_stop))
        except BaseExceptionGroup as errors:
            raise _first_leaf(errors) from None


def _first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


async def _monitor(  # noqa: PLR0917 - the run's parts
    app: App,
    tracker: Tracker,
    fleet: Fleet,
    display: _Display,
    submitted: asyncio.Event,
    hard_stop: float,
) -> None:
    loop = asyncio.get_running_loop()
    while True:
        async with asyncio.timeout(_CALL_TIMEOUT):
            await tracker.poll(app.store)
        fleet.check()
        done = submitted.is_set() and tracker.all_final()
        out_of_time = loop.time() >= hard_stop
        display.show(tracker.snapshot(final=out_of_time), last=done or out_of_time)
        if done or out_of_time:
            return
        await asyncio.sleep(_REFRESH)


def _workflows(tracker: Tracker) -> list[dict[str, Any]]:
    out = []
    for t in tracker.jobs:
        if not t.workflow:
            continue
        took = None
        if t.fin_ms is not None and t.enq_ms is not None:
            took = (t.fin_ms - t.enq_ms) / 1000
        out.append(
            {
                "id": t.job_id,
                "status": t.status,
                "steps": t.steps,
                "of_steps": len(t.arrival.waits),
                "slices": len(t.slice_waits),
                "slice_start_delays_ms": t.slice_waits,
                "enqueued_to_finished_s": took,
            }
        )
    return out


def _report(
    options: DemoOptions, workload: Workload, runs: dict[str, RunReport], console: Console
) -> DemoResult:
    fair, fifo = runs["fair"], runs.get("fifo")
    console.rule("report")
    console.print(comparison_table(fair.snapshot, fifo.snapshot if fifo else None))
    console.print(admission_table(fair.snapshot))
    groups = {
        label: {mode: run.groups[label] for mode, run in runs.items()}
        for label in ("quiet tenants (steady-*, interactive)", "flood (lane light)")
    }
    for line in summary_lines(groups):
        console.print(line)
    rejected = sum(r.rejected for r in fair.snapshot.rows if r.key.tenant == "flood")
    if rejected:
        console.print(
            f"(the flood's fair-run delays count from each admitted submission; the time it "
            f"backed off after its {rejected} rejections, as Retry-After told it, is not in them)",
            style="dim",
        )
    options.out.mkdir(parents=True, exist_ok=True)
    json_path = options.out / JSON_NAME
    svg_path = options.out / SVG_NAME
    settings = {
        "duration_s": options.duration,
        "per_run_s": options.per_run,
        "arrival_window_s": workload.window,
        "steady_tenants": options.tenants,
        "seed": options.seed,
        "tenants": list(workload.tenants),
        "lanes": dict(LANES),
        "fair_weights": FAIR_WEIGHTS,
        "fifo": f"every job submitted as tenant {FIFO_TENANT!r} in class 'standard', no pool",
        "pools_toml": POOLS_TOML,
        "start_delay": "server ms from when a job (a retry, a workflow slice) was due to its "
        "start; a rejected job's back-off before it resubmits is not counted",
    }
    write_json(json_path, settings, runs)
    write_svg(svg_path, runs)
    console.print(f"wrote {json_path} and {svg_path}")
    return DemoResult(runs, json_path, svg_path)
