"""The environment around apps: ``doctor``, ``config view`` and ``server start|stop|status``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from redis.exceptions import RedisClusterException, RedisError
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from fairlane.cli._common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    RedisUrl,
    console,
    fail,
    load_app,
    locate_server,
    settings_or_fail,
)
from fairlane.config.settings import ConfigError, explain_settings
from fairlane.devserver import (
    ServerNotFound,
    ServerStartError,
    dev_server_status,
    ensure_dev_server,
    stop_dev_server,
)
from fairlane.store.api import redact_url
from fairlane.store.connection import SyncClient, create_sync_client
from fairlane.store.doctor import CLUSTER_WIDE, Finding, Level, check_server, pools_finding

__all__ = ["config_app", "doctor", "server_app"]

config_app = typer.Typer(help="Fairlane's settings.", no_args_is_help=True)
server_app = typer.Typer(help="The local development server.", no_args_is_help=True)

_STYLE: dict[Level, str] = {"OK": "bold green", "WARN": "bold yellow", "ERROR": "bold red"}


# -- doctor ----------------------------------------------------------------------------


def doctor(
    app_spec: Annotated[
        str | None,
        typer.Argument(
            metavar="[MODULE:APP]",
            help="Check the server this app uses (and its live workers).",
            show_default=False,
        ),
    ] = None,
    redis_url: RedisUrl = None,
) -> None:
    """Check that a server is fit for Fairlane: version, eviction policy, persistence, Functions.

    With an app, also its live workers and that every admission pool names a lane the
    app uses. On a Redis Cluster every primary is checked, and every slot must be assigned.
    Exits 1 when any check is an ERROR (e.g. an eviction policy that may delete jobs).
    """
    app = load_app(app_spec, redis_url) if app_spec else None
    settings = app.settings if app is not None else settings_or_fail()
    target = locate_server(settings, redis_url, app)
    out = console()
    if target.url is None:
        fail(
            f"no Redis URL is configured and {target.source} is not running: give --redis-url, "
            "set FAIRLANE_REDIS_URL, or start it with `fairlane server start`"
        )
    out.print(f"server {redact_url(target.url)} [dim](from {escape(target.source)})[/]")
    client: SyncClient | None = None
    try:
        client = create_sync_client(target.url, socket_connect_timeout=5.0, socket_timeout=5.0)
        if app is None:
            rows = check_server(client)
        else:
            max_age = settings.lease.duration
            pools = pools_finding(app.registry.config, app.registry.lanes_used())
            rows = check_server(
                client, app.name, max_age=max_age, shards=app.shards, app_findings=[pools]
            )
    except (RedisError, RedisClusterException) as exc:
        fail(f"the server at {redact_url(target.url)} is unreachable: {exc}")
    finally:
        if client is not None:
            client.close()
    per_node = any(node is not None for node, _ in rows)
    out.print(_findings_table(rows, per_node=per_node))
    errors = [(node, f) for node, f in rows if f.level == "ERROR"]
    warnings = sum(1 for _, f in rows if f.level == "WARN")
    if errors:
        if not per_node:
            fail(f"{len(errors)} problem(s) make this server unsafe for Fairlane")
        nodes = ", ".join(dict.fromkeys(node or CLUSTER_WIDE for node, _ in errors))
        fail(f"{len(errors)} problem(s) make this cluster unsafe for Fairlane (on {nodes})")
    out.print(f"[green]ready[/] ({warnings} warning(s))" if warnings else "[green]ready[/]")


def _findings_table(rows: list[tuple[str | None, Finding]], *, per_node: bool) -> Table:
    """One row per finding; on a cluster, grouped by check with the node of each, the
    check named on its first row only so that each check stays one line to search for."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(width=5)
    table.add_column(style="bold")
    if per_node:
        table.add_column(style="cyan", no_wrap=True)
    table.add_column(overflow="fold")
    groups: dict[str, list[tuple[str | None, Finding]]] = {}
    for node, finding in rows:
        groups.setdefault(finding.check, []).append((node, finding))
    for check, members in groups.items():
        for i, (node, finding) in enumerate(members):
            cells: list[Text | str] = [
                Text(finding.level, style=_STYLE[finding.level]),
                check if i == 0 else "",
            ]
            if per_node:
                cells.append(Text(node or ""))
            cells.append(escape(finding.detail))
            table.add_row(*cells)
    return table


# -- config view -----------------------------------------------------------------------


@config_app.command("view")
def config_view(
    project_dir: Annotated[
        Path | None,
        typer.Option(
            "--project-dir",
            metavar="DIR",
            file_okay=False,
            help="Directory holding fairlane.toml / pyproject.toml (default: the "
            "working directory).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Show every setting's effective value and where it came from."""
    try:
        origins = explain_settings(project_dir=project_dir)
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    table = Table(title="Fairlane settings", title_justify="left")
    table.add_column("setting", style="bold")
    table.add_column("value", overflow="fold")
    table.add_column("source", overflow="fold")
    for origin in origins:
        value = origin.value
        shown = redact_url(value) if origin.key == "redis_url" and isinstance(value, str) else value
        style = "dim" if origin.source == "default" else ""
        table.add_row(
            origin.key,
            Text(repr(shown) if isinstance(shown, str) else str(shown), style=style),
            Text(origin.source, style=style),
        )
    console().print(table)


# -- server ----------------------------------------------------------------------------


@server_app.command("start")
def server_start() -> None:
    """Start this user's local dev server (if it is not running) and print its URL."""
    settings = settings_or_fail()
    try:
        url = ensure_dev_server(settings.server.state_dir, settings.server.binary)
    except (ServerNotFound, ServerStartError) as exc:
        fail(str(exc))
    console().print(f"dev server running at {url}")


@server_app.command("stop")
def server_stop() -> None:
    """Stop the local dev server (its data is kept for the next start)."""
    settings = settings_or_fail()
    try:
        stopped = stop_dev_server(settings.server.state_dir)
    except TimeoutError as exc:
        fail(str(exc))
    console().print("dev server stopped" if stopped else "dev server was not running")


@server_app.command("status")
def server_status() -> None:
    """Report whether the local dev server runs; exits 1 when it does not."""
    settings = settings_or_fail()
    status = dev_server_status(settings.server.state_dir)
    out = console()
    if not status.running:
        out.print(
            f"dev server not running (state dir {status.state_dir})"
            + (f"; pid {status.pid} is alive but not answering" if status.pid else "")
        )
        raise typer.Exit(EXIT_FAILURE)
    out.print(f"dev server running at {status.url}")
    out.print(f"  pid {status.pid}, version {status.version or '?'}, state dir {status.state_dir}")
