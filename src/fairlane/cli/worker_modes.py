"""``fairlane worker``'s modes besides running one worker in this process.

``--check`` health-checks a worker of the app (its heartbeat, and ``/health`` when
given a port); ``--reload`` runs the worker in a child process restarted when Python
files change; ``--processes N`` runs N worker processes under a supervisor. Each child
is started with the argv that gives it the command's own options (``child_argv``).
"""

from __future__ import annotations

import importlib
import logging
import os
import shlex
import sys
import urllib.error
import urllib.request
from typing import Any

import typer
from redis.exceptions import RedisError
from rich.logging import RichHandler

from fairlane.app import App
from fairlane.cli._common import (
    EXIT_USAGE,
    console,
    err_console,
    fail,
    live_workers,
    load_app,
    locate_server,
    settings_or_fail,
)
from fairlane.runtime.supervisor import Supervisor
from fairlane.store.api import redact_url
from fairlane.store.connection import create_sync_client

__all__ = [
    "child_argv",
    "configure_logging",
    "fairlane_command",
    "health_check",
    "reload_on_changes",
    "split_lanes",
    "supervise",
]

_HTTP_TIMEOUT = 3.0


def split_lanes(text: str) -> list[str]:
    lanes = [lane.strip() for lane in text.split(",") if lane.strip()]
    if not lanes:
        fail("--lanes needs at least one lane name", EXIT_USAGE)
    return lanes


def configure_logging(verbose: bool) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    root = logging.getLogger()
    if not root.handlers:
        handler = RichHandler(console=err_console(), show_path=False, rich_tracebacks=True)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.getLogger("fairlane").setLevel(level)


# -- --check ---------------------------------------------------------------------------


def health_check(app: App, health_port: int | None) -> None:
    """Exit 0 if a worker of ``app`` is alive (and its /health answers), else exit 1."""
    target = locate_server(app.settings, None, app)
    if target.url is None:
        fail(f"unhealthy: {target.source} is not running")
    max_age = app.settings.lease.duration
    client = create_sync_client(target.url, socket_connect_timeout=3.0, socket_timeout=3.0)
    try:
        workers = live_workers(client, app.name, max_age, app.shards)
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
        problem = probe_health(health_port)
        if problem:
            fail(f"unhealthy: {problem}")
    console().print(
        f"ok: {len(workers)} live worker(s) of app {app.name!r}; newest heartbeat "
        f"{newest_age:.1f}s ago ({newest_id})"
        + (f"; /health on port {health_port} answers 200" if health_port is not None else "")
    )


def probe_health(port: int) -> str | None:
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


def child_argv(
    app_spec: str,
    *,
    lanes: str | None,
    concurrency: int | None,
    health_port: int | None,
    redis_url: str | None,
    verbose: bool,
    burst: bool = False,
    metrics: list[str] | None = None,
    pressure: list[str] | None = None,
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
    argv += pressure or []
    if redis_url:
        argv += ["--redis-url", redis_url]
    if verbose:
        argv.append("--verbose")
    return argv


def fairlane_command(argv: list[str]) -> list[str]:
    """The command that runs ``fairlane <argv>`` with this interpreter."""
    return [sys.executable, "-m", "fairlane.cli", *argv]


def reload_on_changes(argv: list[str]) -> None:
    """Run ``fairlane <argv>`` in a child process, restarting it when Python files change."""
    try:
        watchfiles: Any = importlib.import_module("watchfiles")  # the optional reload extra
    except ImportError:
        fail("--reload needs watchfiles: pip install 'fairlane[reload]'", EXIT_USAGE)
    command = shlex.join(fairlane_command(argv))
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


def supervise(
    app_spec: str,
    processes: int,
    *,
    lanes: str | None,
    concurrency: int | None,
    burst: bool,
    redis_url: str | None,
    verbose: bool,
    pressure: list[str] | None = None,
) -> None:
    """Run ``processes`` workers as child processes until SIGTERM/SIGINT; exit with its code."""
    configure_logging(verbose)
    if lanes is not None:
        split_lanes(lanes)  # a usage error now, rather than N children failing on it
    # Loading the app here fails fast on a bad MODULE:APP, and its settings (not only the
    # environment's) give the grace period the children drain for on SIGTERM.
    app = load_app(app_spec, redis_url)
    argv = child_argv(
        app_spec,
        lanes=lanes,
        concurrency=concurrency,
        health_port=None,
        redis_url=redis_url,
        verbose=verbose,
        burst=burst,
        pressure=pressure,
    )
    supervisor = Supervisor(
        fairlane_command(argv),
        processes,
        grace_period=app.settings.worker.grace_period,
        # a child exiting 2 met a usage error, which restarting would only repeat
        fatal_exit_codes=(EXIT_USAGE,),
    )
    raise typer.Exit(supervisor.run())
