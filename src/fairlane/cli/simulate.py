"""``fairlane simulate``: compare scheduling policies on a virtual clock (no server needed).

The command only parses options and prints; the simulator is ``fairlane.sim``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from fairlane.cli._common import EXIT_USAGE, console, fail
from fairlane.config.settings import ConfigError
from fairlane.sim import find_scenario, run, shipped
from fairlane.sim.chart import write_charts
from fairlane.sim.report import print_report, write_json

__all__ = ["simulate"]

_FILE_WIDTH = 200

_COMPARE_HELP = (
    "Variants to compare on the same arrivals, comma-separated or repeated (default: the "
    "scenario's \\[compare] list, else fair,fifo). A variant is a policy, fair or fifo, "
    "joined by + to overrides: slice=SECONDS|inf, admission=on|off, throttles=on|off, "
    "classes=on|off, charge=time|jobs|units, waiters=fair|fifo (throttle key waiters: "
    "grouped by tenant and woken fairly, the key taken with a lane slot; or one FIFO per "
    "key with the grant held while its job waits for a lane slot), rate=none|static|adaptive|"
    "both (which of a key's rate and adaptive limit are in force: none retries 429s with "
    "backoff); e.g. 'slice=0.5,slice=inf', 'fair,fair+admission=off,fifo', "
    "'waiters=fair,waiters=fifo' or 'rate=none,rate=static,rate=adaptive'."
)


def simulate(
    scenario: Annotated[
        str | None,
        typer.Argument(
            help="A shipped scenario's name (see --list) or the path of a scenario TOML file.",
            show_default=False,
        ),
    ] = None,
    *,
    list_scenarios: Annotated[
        bool, typer.Option("--list", help="List the shipped scenarios and exit.")
    ] = False,
    compare: Annotated[
        list[str] | None, typer.Option("--compare", "-c", help=_COMPARE_HELP, show_default=False)
    ] = None,
    scale: Annotated[
        float,
        typer.Option(
            help="Multiply the scenario's times and burst counts (rates, sizes and slots kept): "
            "the job count scales with it at the same load; 0.01 gives a quick run."
        ),
    ] = 1.0,
    seed: Annotated[
        int | None, typer.Option(help="Replace the scenario's seed.", show_default=False)
    ] = None,
    json_path: Annotated[
        Path | None,
        typer.Option("--json", metavar="PATH", help="Write every figure as JSON to PATH."),
    ] = None,
    chart: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH.svg",
            help="Write an SVG chart of p99 start delay by group to PATH.svg and one of the "
            "queue length over time to PATH-queue.svg.",
        ),
    ] = None,
    tenants: Annotated[
        int,
        typer.Option(help="Also print a row per tenant when the scenario has at most this many."),
    ] = 0,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Processes to run the variants in (default: one per variant and CPU for "
            "scenarios of 200k jobs or more, else 1).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Simulate a scenario on a virtual clock and compare policies on the same arrivals.

    A discrete-event run of the pure policy core -- service classes, weighted fair
    queuing of tenants, the admission gate, throttles -- with no Redis: per-tenant and
    per-class start delays (p50/p99/max), shares against weights and Jain's index,
    utilisation, rejections by reason and the longest queue. `fair` is the policy core;
    `fifo` is one plain queue per lane with no admission.
    """
    out = console()
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(highlight=False, soft_wrap=False, width=_FILE_WIDTH)  # tables stay whole
    if list_scenarios:
        table = Table("scenario", "description", title="Shipped scenarios", title_justify="left")
        for name, description in shipped():
            table.add_row(name, description)
        out.print(table)
        return
    if scenario is None:
        fail("name a scenario (fairlane simulate --list shows the shipped ones)", EXIT_USAGE)
    if workers is not None and workers < 1:
        fail("--workers must be at least 1", EXIT_USAGE)
    try:
        comparison = run(
            find_scenario(scenario), compare or (), scale=scale, seed=seed, workers=workers
        )
    except (ConfigError, ValueError) as exc:
        fail(str(exc), EXIT_USAGE)
    print_report(comparison, out, tenants=tenants)
    if json_path is not None:
        write_json(comparison, json_path)
        out.print(f"wrote {json_path}")
    if chart is not None:
        for path in write_charts(comparison, chart):
            out.print(f"wrote {path}")
