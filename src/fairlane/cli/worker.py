"""``fairlane worker``: run a worker (or supervise several), restart it on code changes, or
health-check one."""

from __future__ import annotations

import importlib
import logging
import os
import shlex
import sys
import urllib.error
import urllib.request
from typing import Annotated, Any

import redis
import typer
from redis.exceptions import RedisError
from rich.logging import RichHandler

from fairlane.app import App
from fairlane.cli._common import (
    EXIT_USAGE,
    AppSpec,
    RedisUrl,
    console,
    err_console,
    fail,
    live_workers,
    load_app,
    locate_server,
    run,
    settings_or_fail,
)
from fairlane.metrics import MetricsConfig
from fairlane.runtime.supervisor import Supervisor
from fairlane.store.redis import redact_url

__all__ = ["worker"]

log = logging.getLogger("fairlane.cli")
_HTTP_TIMEOUT = 3.0


def worker(
    app_spec: AppSpec,
    *,
    lanes: Annotated[
        str | None,
        typer.Option(
            "--lanes",
            metavar="LANES",
            help="Comma-separated lanes to serve, e.g. light,heavy (default: the "
            "worker.lanes setting).",
            show_default=False,
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Worker slots: jobs run at once, a job declared with slots=N taking N "
            "(default: the worker.concurrency setting, 50).",
            show_default=False,
        ),
    ] = None,
    burst: Annotated[
        bool, typer.Option("--burst", help="Exit once there is no work left.")
    ] = False,
    reload: Annotated[
        bool,
        typer.Option(
            "--reload",
            help="Development: restart the worker when a Python file under the working "
            "directory changes (needs fairlane\\[reload]).",
        ),
    ] = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Health check, not a worker: exit 0 when a worker of the app sent a "
            "heartbeat within lease.duration (and /health on --health-port answers 200), "
            "else 1.",
        ),
    ] = False,
    health_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            metavar="PORT",
            help="Serve GET /health on 127.0.0.1:PORT (with --check: the port to probe).",
            show_default=False,
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=0,
            max=65535,
            metavar="PORT",
            help="Serve Prometheus metrics (GET /metrics) and autoscaler JSON (GET /autoscale) "
            "on 0.0.0.0:PORT.",
            show_default=False,
        ),
    ] = None,
    metrics_tenants: Annotated[
        str | None,
        typer.Option(
            "--metrics-tenants",
            metavar="TENANTS",
            help="Comma-separated tenants that always get their own tenant label in metrics.",
            show_default=False,
        ),
    ] = None,
    metrics_top_n: Annotated[
        int,
        typer.Option(
            "--metrics-top-n",
            min=0,
            metavar="N",
            help="Besides --metrics-tenants, the N busiest tenants get their own tenant "
            "label; all others are labelled 'other'.",
        ),
    ] = 20,
    processes: Annotated[
        int | None,
        typer.Option(
            "--processes",
            min=1,
            metavar="N",
            help="Run N worker processes under a supervisor that restarts any that dies and "
            "stops them all on SIGTERM/SIGINT (default 1: this process is the worker).",
            show_default=False,
        ),
    ] = None,
    redis_url: RedisUrl = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log debug messages.")] = False,
) -> None:
    """Run a worker for MODULE:APP until SIGTERM/SIGINT (graceful), or with --burst until idle."""
    if reload and (check or burst):
        fail("--reload cannot be combined with --check or --burst", EXIT_USAGE)
    if processes is not None and (reload or check):
        fail("--processes cannot be combined with --reload or --check", EXIT_USAGE)
    if processes is not None and processes > 1:
        if health_port is not None:
            fail(
                "--processes cannot be combined with --health-port: the worker processes "
                "would all bind the same port (use `fairlane worker --check` instead)",
                EXIT_USAGE,
            )
        if metrics_port is not None:
            fail(
                "--processes cannot be combined with --metrics-port: the worker processes "
                "would all bind the same port (run one worker per port instead)",
                EXIT_USAGE,
            )
        _supervise(
            app_spec,
            processes,
            lanes=lanes,
            concurrency=concurrency,
            burst=burst,
            redis_url=redis_url,
            verbose=verbose,
        )
        return
    if check:
        _check(load_app(app_spec, redis_url), health_port)
        return
    if reload:
        _reload(
            _child_argv(
                app_spec,
                lanes=lanes,
                concurrency=concurrency,
                health_port=health_port,
                redis_url=redis_url,
                verbose=verbose,
                metrics=_metrics_argv(metrics_port, metrics_tenants, metrics_top_n),
            )
        )
        return
    _configure_logging(verbose)
    app = load_app(app_spec, redis_url)
    lane_list = _split_lanes(lanes) if lanes is not None else None
    target = locate_server(app.settings, redis_url, app)
    if target.url is None:
        log.info("no Redis URL configured: using %s (starting it if needed)", target.source)
    else:
        log.info("using server %s (from %s)", redact_url(target.url), target.source)
    run(
        app.run_worker(
            lanes=lane_list,
            concurrency=concurrency,
            burst=burst,
            handle_signals=True,
            health_port=health_port,
            metrics_port=metrics_port,
            metrics=MetricsConfig(
                tenants=frozenset(_split_names(metrics_tenants)), top_n=metrics_top_n
            ),
        )
    )


def _split_names(text: str | None) -> list[str]:
    return [name.strip() for name in (text or "").split(",") if name.strip()]


def _metrics_argv(port: int | None, tenants: str | None, top_n: int) -> list[str]:
    if port is None:
        return []
    argv = ["--metrics-port", str(port), "--metrics-top-n", str(top_n)]
    return argv + (["--metrics-tenants", tenants] if tenants else [])


def _split_lanes(text: str) -> list[str]:
    lanes = [lane.strip() for lane in text.split(",") if lane.strip()]
    if not lanes:
        fail("--lanes needs at least one lane name", EXIT_USAGE)
    return lanes


def _configure_logging(verbose: bool) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    root = logging.getLogger()
    if not root.handlers:
        handler = RichHandler(console=err_console(), show_path=False, rich_tracebacks=True)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.getLogger("fairlane").setLevel(level)


# -- --check ---------------------------------------------------------------------------


def _check(app: App, health_port: int | None) -> None:
    """Exit 0 if a worker of ``app`` is alive (and its /health answers), else exit 1."""
    target = locate_server(app.settings, None, app)
    if target.url is None:
        fail(f"unhealthy: {target.source} is not running")
    max_age = app.settings.lease.duration
    client = redis.Redis.from_url(target.url, socket_connect_timeout=3.0, socket_timeout=3.0)
    try:
        workers = live_workers(client, app.name, max_age)
    except RedisError as exc:
        fail(f"unhealthy: the server at {redact_url(target.url)} is unreachable: {exc}")
    finally:
        client.close()
    if not workers:
        fail(
            f"unhealthy: no worker of app {app.name!r} has sent a heartbeat in the last "
            f"{max_age:g}s (lease.duration)"
        )
    newest_id, newest_age = workers[0]
    if health_port is not None:
        problem = _probe_health(health_port)
        if problem:
            fail(f"unhealthy: {problem}")
    console().print(
        f"ok: {len(workers)} live worker(s) of app {app.name!r}; newest heartbeat "
        f"{newest_age:.1f}s ago ({newest_id})"
        + (f"; /health on port {health_port} answers 200" if health_port is not None else "")
    )


def _probe_health(port: int) -> str | None:
    url = f"http://127.0.0.1:{port}/health"
    try:
        with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:200]
        return f"{url} answered {exc.code}: {detail}"
    except (urllib.error.URLError, OSError) as exc:
        return f"nothing answers at {url}: {getattr(exc, 'reason', exc)}"
    return None if status == 200 else f"{url} answered {status}"


# -- --reload --------------------------------------------------------------------------


def _child_argv(
    app_spec: str,
    *,
    lanes: str | None,
    concurrency: int | None,
    health_port: int | None,
    redis_url: str | None,
    verbose: bool,
    burst: bool = False,
    metrics: list[str] | None = None,
) -> list[str]:
    argv = ["worker", app_spec]
    if lanes is not None:
        argv += ["--lanes", lanes]
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency)]
    if burst:
        argv.append("--burst")
    if health_port is not None:
        argv += ["--health-port", str(health_port)]
    argv += metrics or []
    if redis_url:
        argv += ["--redis-url", redis_url]
    if verbose:
        argv.append("--verbose")
    return argv


def _fairlane_command(argv: list[str]) -> list[str]:
    """The command that runs ``fairlane <argv>`` with this interpreter."""
    return [sys.executable, "-m", "fairlane.cli", *argv]


def _reload(argv: list[str]) -> None:
    """Run ``fairlane <argv>`` in a child process, restarting it when Python files change."""
    try:
        watchfiles: Any = importlib.import_module("watchfiles")  # the optional reload extra
    except ImportError:
        fail("--reload needs watchfiles: pip install 'fairlane[reload]'", EXIT_USAGE)
    command = shlex.join(_fairlane_command(argv))
    grace = settings_or_fail().worker.grace_period
    cwd = os.getcwd()
    err_console().print(f"[dim]watching {cwd} for changes to *.py; the worker restarts on each[/]")

    def changed(changes: set[tuple[Any, str]]) -> None:
        names = sorted({os.path.relpath(path, cwd) for _, path in changes})
        err_console().print(f"[yellow]changed:[/] {', '.join(names[:5])}; restarting the worker")

    watchfiles.run_process(
        cwd,
        target=command,
        target_type="command",
        watch_filter=watchfiles.PythonFilter(),
        callback=changed,
        sigint_timeout=int(grace) + 5,  # the worker drains for up to grace_period on SIGINT
    )
    raise typer.Exit(0)


# -- --processes -----------------------------------------------------------------------


def _supervise(
    app_spec: str,
    processes: int,
    *,
    lanes: str | None,
    concurrency: int | None,
    burst: bool,
    redis_url: str | None,
    verbose: bool,
) -> None:
    """Run ``processes`` workers as child processes until SIGTERM/SIGINT; exit with its code."""
    _configure_logging(verbose)
    if lanes is not None:
        _split_lanes(lanes)  # a usage error now, rather than N children failing on it
    # Loading the app here fails fast on a bad MODULE:APP, and its settings (not only the
    # environment's) give the grace period the children drain for on SIGTERM.
    app = load_app(app_spec, redis_url)
    argv = _child_argv(
        app_spec,
        lanes=lanes,
        concurrency=concurrency,
        health_port=None,
        redis_url=redis_url,
        verbose=verbose,
        burst=burst,
    )
    supervisor = Supervisor(
        _fairlane_command(argv),
        processes,
        grace_period=app.settings.worker.grace_period,
        # a child exiting 2 met a usage error, which restarting would only repeat
        fatal_exit_codes=(EXIT_USAGE,),
    )
    raise typer.Exit(supervisor.run())
