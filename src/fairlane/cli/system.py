"""The environment around apps: ``doctor``, ``config view`` and ``server start|stop|status``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import redis
import typer
from redis.exceptions import RedisClusterException, RedisError, ResponseError
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from fairlane.cli._common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    RedisUrl,
    console,
    fail,
    live_workers,
    load_app,
    locate_server,
    settings_or_fail,
)
from fairlane.config.settings import ConfigError, explain_settings
from fairlane.store.api import redact_url
from fairlane.store.connection import SyncClient, create_sync_client
from fairlane.store.server import (
    ServerNotFound,
    ServerStartError,
    dev_server_status,
    ensure_dev_server,
    stop_dev_server,
)

__all__ = ["config_app", "doctor", "server_app"]

config_app = typer.Typer(help="Fairlane's settings.", no_args_is_help=True)
server_app = typer.Typer(help="The local development server.", no_args_is_help=True)

Level = Literal["OK", "WARN", "ERROR"]
_STYLE: dict[Level, str] = {"OK": "bold green", "WARN": "bold yellow", "ERROR": "bold red"}
_MIN_VERSION = (7, 0)
_MEMORY_WARN = 0.9
_CLUSTER_WIDE = "cluster"  # the node column of findings about a whole cluster
_CLUSTER_SLOTS = 16384


@dataclass(frozen=True)
class Finding:
    level: Level
    check: str
    detail: str


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

    On a Redis Cluster every primary is checked, and every slot must be assigned.
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
        wide: str | None = None  # where findings about the whole deployment are shown
        if isinstance(client, redis.RedisCluster):
            rows = _diagnose_cluster(client)
            wide = _CLUSTER_WIDE
        else:
            rows = [(None, finding) for finding in _diagnose(client)]
        if app is not None:
            finding = _workers_finding(client, app.name, settings.lease.duration, app.shards)
            rows.append((wide, finding))
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
        nodes = ", ".join(dict.fromkeys(node or _CLUSTER_WIDE for node, _ in errors))
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


def _node_name(node: Any) -> str:
    host, port = str(node.host), int(node.port)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _diagnose_cluster(client: redis.RedisCluster) -> list[tuple[str | None, Finding]]:
    """Every primary checked as a server of its own (each holds jobs of the apps whose
    slots it serves), then whether every slot is served. A primary that does not answer
    is an ERROR of its own rather than the end of the report."""
    rows: list[tuple[str | None, Finding]] = []
    states: dict[str, dict[str, str]] = {}
    get_primaries: Any = client.get_primaries  # unannotated in redis-py
    primaries: list[Any] = get_primaries()
    for node in sorted(primaries, key=lambda n: (str(n.host), int(n.port))):
        name = _node_name(node)
        # the cluster client's own client of the node: the URL's login, TLS and timeouts
        direct: redis.Redis = client.get_redis_connection(node)
        try:
            findings = _diagnose(direct)
            states[name] = _cluster_info(direct)
        except RedisError as exc:
            findings = [Finding("ERROR", "ping", f"unreachable: {exc}")]
        rows.extend((name, finding) for finding in findings)
    rows.insert(0, (_CLUSTER_WIDE, _slots_finding(states, len(primaries))))
    return rows


def _cluster_info(client: redis.Redis) -> dict[str, str]:
    run: Any = client.execute_command
    reply: Any = run("CLUSTER", "INFO")
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    text = reply.decode() if isinstance(reply, bytes) else str(reply)
    return dict(line.strip().split(":", 1) for line in text.splitlines() if ":" in line)


def _slots_finding(states: dict[str, dict[str, str]], primaries: int) -> Finding:
    if not states:
        return Finding("ERROR", "slots", "no primary answered CLUSTER INFO")
    faults = []
    for name, info in states.items():
        state = info.get("cluster_state", "?")
        assigned = info.get("cluster_slots_assigned", "?")
        if state != "ok" or assigned != str(_CLUSTER_SLOTS):
            faults.append(f"{name} reports cluster_state {state}, {assigned} slots assigned")
    if faults:
        return Finding(
            "ERROR",
            "slots",
            "; ".join(faults) + ": jobs in uncovered slots cannot be enqueued or fetched",
        )
    return Finding(
        "OK",
        "slots",
        f"all {_CLUSTER_SLOTS} slots assigned, cluster_state ok ({primaries} primaries)",
    )


def _diagnose(client: SyncClient) -> list[Finding]:
    started = time.perf_counter()
    client.ping()
    rtt = (time.perf_counter() - started) * 1000
    info: dict[str, Any] = {}
    for section in ("server", "memory", "persistence"):
        info.update(client.info(section))
    return [
        Finding("OK", "ping", f"{rtt:.1f} ms"),
        _version_finding(info),
        _policy_finding(client, info),
        _persistence_finding(client, info),
        _memory_finding(info),
        _functions_finding(client),
    ]


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _version_finding(info: dict[str, Any]) -> Finding:
    redis_version = str(info.get("redis_version", "?"))
    valkey = info.get("valkey_version")
    name = (
        f"Valkey {valkey} (redis_version {redis_version})" if valkey else f"Redis {redis_version}"
    )
    if valkey is None and _version_tuple(redis_version) < _MIN_VERSION:
        return Finding("ERROR", "version", f"{name}: Fairlane needs Redis 7.0+ or Valkey 7.2+")
    return Finding("OK", "version", name)


def _config(client: SyncClient, name: str) -> str | None:
    """A CONFIG GET value, or None where CONFIG is disabled (as on some managed services)."""
    try:
        reply: dict[Any, Any] = client.config_get(name)
    except ResponseError:
        return None
    value: Any = reply.get(name, reply.get(name.encode()))
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _policy_finding(client: SyncClient, info: dict[str, Any]) -> Finding:
    policy = info.get("maxmemory_policy") or _config(client, "maxmemory-policy")
    if policy is None:
        return Finding("WARN", "maxmemory-policy", "unknown (neither INFO nor CONFIG reports it)")
    if policy != "noeviction":
        return Finding(
            "ERROR",
            "maxmemory-policy",
            f"{policy}: the server may evict job records and queues under memory pressure; "
            "set maxmemory-policy noeviction",
        )
    return Finding("OK", "maxmemory-policy", "noeviction (writes fail instead of losing jobs)")


def _persistence_finding(client: SyncClient, info: dict[str, Any]) -> Finding:
    appendonly = _config(client, "appendonly")
    aof = appendonly == "yes" if appendonly is not None else bool(info.get("aof_enabled"))
    fsync = _config(client, "appendfsync")
    save = _config(client, "save")
    parts = [f"appendonly {'yes' if aof else 'no'}"]
    if fsync is not None:
        parts.append(f"appendfsync {fsync}")
    if save is not None:
        parts.append(f"save {save!r}")
    described = ", ".join(parts)
    if aof and fsync in ("always", "everysec"):
        loss = "none" if fsync == "always" else "about 1s of writes"
        return Finding("OK", "persistence", f"{described}: a crash loses {loss}")
    if aof:
        return Finding(
            "WARN",
            "persistence",
            f"{described}: fsync is left to the OS; a crash can lose ~30s of jobs",
        )
    if save:
        return Finding(
            "WARN",
            "persistence",
            f"{described}: snapshots only; a crash loses jobs since the last one",
        )
    return Finding("WARN", "persistence", f"{described}: no persistence; a restart loses every job")


def _memory_finding(info: dict[str, Any]) -> Finding:
    limit = int(info.get("maxmemory", 0) or 0)
    used = int(info.get("used_memory", 0) or 0)
    used_h = info.get("used_memory_human", f"{used}B")
    if limit == 0:
        return Finding("OK", "maxmemory", f"no limit (using {used_h})")
    share = used / limit
    level: Level = "WARN" if share >= _MEMORY_WARN else "OK"
    return Finding(
        level, "maxmemory", f"{info.get('maxmemory_human', limit)} ({share:.0%} used, {used_h})"
    )


def _functions_finding(client: SyncClient) -> Finding:
    try:
        libraries = client.function_list()
    except ResponseError as exc:
        return Finding("ERROR", "functions", f"FUNCTION LIST failed: {exc}")
    names = []
    for library in libraries:
        fields = library if isinstance(library, dict) else _pairs(library)
        raw = fields.get(b"library_name", fields.get("library_name", b""))
        names.append(raw.decode() if isinstance(raw, bytes) else str(raw))
    ours = sorted(name for name in names if name.startswith("fairlane_"))
    if ours:
        loaded = f"Fairlane library loaded: {', '.join(ours)}"
    else:
        loaded = "no Fairlane library loaded yet (loaded on first connect)"
    count = f"{len(names)} librar{'y' if len(names) == 1 else 'ies'}"
    return Finding("OK", "functions", f"available ({count}; {loaded})")


def _pairs(flat: list[Any]) -> dict[Any, Any]:
    return dict(zip(flat[::2], flat[1::2], strict=False))


def _workers_finding(client: SyncClient, app_name: str, max_age: float, shards: int) -> Finding:
    workers = live_workers(client, app_name, max_age, shards)
    if not workers:
        return Finding("WARN", "workers", f"no live worker of app {app_name!r}")
    return Finding("OK", "workers", f"{len(workers)} live worker(s) of app {app_name!r}")


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
