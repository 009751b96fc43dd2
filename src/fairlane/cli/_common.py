"""Shared pieces of the command line: consoles, loading ``MODULE:APP``, running coroutines.

Exit codes used by every command: 0 success, 1 a runtime failure (server unreachable,
a check failed), 2 a usage problem (bad arguments, an app that cannot be imported or
settings that do not load).
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rich.console import Console
from rich.markup import escape

from fairlane.app import App
from fairlane.config.settings import ConfigError, Settings, load_settings
from fairlane.devserver import ServerNotFound, ServerStartError, dev_server_status
from fairlane.errors import StoreFull
from fairlane.runtime.loop import run as run_loop
from fairlane.store.connection import SyncClient
from fairlane.store.keys import AppKeys
from fairlane.store.reads import run_sync
from fairlane.store.views.fleet import live_workers as workers_alive
from fairlane.store.wire import StoreUnavailable

__all__ = [
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "AppSpec",
    "JobId",
    "RedisUrl",
    "ServerTarget",
    "console",
    "err_console",
    "fail",
    "live_workers",
    "load_app",
    "locate_server",
    "run",
    "settings_or_fail",
]

T = TypeVar("T")

EXIT_FAILURE = 1
EXIT_USAGE = 2

AppSpec = Annotated[
    str,
    typer.Argument(
        metavar="MODULE:APP",
        help="Where the app is: a module path and the App's attribute, e.g. myproject.tasks:app "
        "(the attribute defaults to `app`). The working directory is importable.",
        show_default=False,
    ),
]
JobId = Annotated[str, typer.Argument(metavar="JOB_ID", show_default=False)]
RedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        metavar="URL",
        help="Server URL (redis://, rediss:// or unix://); overrides the app's and the "
        "settings' URL.",
        show_default=False,
    ),
]


def utc_ms(ms: int | None, *, millis: bool = True) -> str:
    """A time in ms since the epoch (the server's, mostly) as UTC text, to the ms (to
    the second without ``millis``, and no zone letter: for a column headed UTC); "-" for
    none."""
    if ms is None:
        return "-"
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    if not millis:
        return moment.strftime("%Y-%m-%d %H:%M:%S")
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def console() -> Console:
    """A console on stdout, built per use so it follows redirection and $COLUMNS."""
    return Console(highlight=False, soft_wrap=False)


def err_console() -> Console:
    return Console(stderr=True, highlight=False)


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    """Print ``message`` as an error on stderr and exit with ``code``."""
    err_console().print(f"[bold red]error:[/] {escape(message)}")
    raise typer.Exit(code)


def settings_or_fail() -> Settings:
    try:
        return load_settings()
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)


def _import_module(name: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # like other worker CLIs: the project is importable
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (name == missing or name.startswith(missing + ".")):
            fail(
                f"cannot import module {name!r}: no such module (looked in {cwd} and sys.path)",
                EXIT_USAGE,
            )
        _print_import_traceback(exc)
        fail(f"importing {name!r} failed: {exc}", EXIT_USAGE)
    except ConfigError as exc:
        fail(f"importing {name!r} failed: {exc}", EXIT_USAGE)
    except Exception as exc:  # any error in user code is reported, then exit 2
        _print_import_traceback(exc)
        fail(f"importing {name!r} failed: {type(exc).__name__}: {exc}", EXIT_USAGE)


def _print_import_traceback(exc: BaseException) -> None:
    """The traceback of a failed import, without the import machinery's own frames."""
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if frame.filename != __file__
        and not frame.filename.startswith("<frozen")
        and os.path.basename(os.path.dirname(frame.filename)) != "importlib"
    ]
    lines = [
        "Traceback (most recent call last):\n",
        *traceback.format_list(frames),
        *traceback.format_exception_only(exc),
    ]
    err_console().print(escape("".join(lines).rstrip()), style="dim")


def load_app(spec: str, redis_url: str | None = None) -> App:
    """Import ``MODULE:APP`` and return the App; exit 2 with a clear message if it is not one.

    ``redis_url`` (from ``--redis-url``) replaces the URL the app would otherwise use.
    """
    module_name, _, attribute = spec.partition(":")
    attribute = attribute or "app"
    if not module_name or not all(part.isidentifier() for part in module_name.split(".")):
        fail(f"{spec!r} is not MODULE:APP (e.g. myproject.tasks:app)", EXIT_USAGE)
    obj: Any = _import_module(module_name)
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            fail(f"module {module_name!r} has no attribute {attribute!r}", EXIT_USAGE)
    if not isinstance(obj, App):
        fail(f"{spec} is a {type(obj).__name__}, not a fairlane.App", EXIT_USAGE)
    if redis_url:
        obj.redis_url = redis_url  # the command line wins over App(redis_url=...) and settings
    return obj


@dataclass(frozen=True)
class ServerTarget:
    """The server a command talks to, found without starting anything."""

    url: str | None  # None when nothing is configured and the dev server is not running
    source: str


def locate_server(
    settings: Settings, explicit: str | None = None, app: App | None = None
) -> ServerTarget:
    """Which server an app (or the settings) would use; never starts the dev server."""
    if explicit:
        return ServerTarget(explicit, "--redis-url")
    if app is not None and app.redis_url:
        return ServerTarget(app.redis_url, "App(redis_url=...)")
    if settings.redis_url:
        return ServerTarget(settings.redis_url, "the redis_url setting")
    status = dev_server_status(settings.server.state_dir)
    where = f"the local dev server in {status.state_dir}"
    return ServerTarget(status.url if status.running else None, where)


def live_workers(
    client: SyncClient, app_name: str, max_age: float, shards: int = 1
) -> list[tuple[str, float]]:
    """Workers of the app whose heartbeat is younger than ``max_age`` s, with their age (s).

    Every worker serves, and beats in, every shard: the home shard's set has them all."""
    return run_sync(client, workers_alive(AppKeys.for_shard(app_name, 0, shards), max_age))


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``; an unreachable, full or unstartable server becomes a clear error and
    exit 1."""
    try:
        return run_loop(coro)
    except StoreUnavailable as exc:
        fail(f"{exc} (check --redis-url / FAIRLANE_REDIS_URL; `fairlane doctor` helps)")
    except StoreFull as exc:
        fail(f"{exc} (run workers to drain it, or give the server more memory)")
    except (RedisConnectionError, RedisTimeoutError) as exc:
        fail(f"the Redis server is unreachable: {exc}")
    except (ServerNotFound, ServerStartError) as exc:
        fail(f"the local dev server could not be started: {exc}")
