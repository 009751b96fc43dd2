"""Shared helpers of the end-to-end tests: settings, running workers, key counting.

Task functions that run in a thread or a child process are resolved by import path
(``module:qualname``), so they live here, at module level, where the worker and its
children can import them as ``tests.e2e.helpers``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fairlane import App
from fairlane.app.worker import Worker
from fairlane.config.settings import Settings, load_settings
from fairlane.store.connection import create_client

ROOT = Path(__file__).resolve().parents[2]
WAIT = 15.0  # upper bound of any single wait in these tests


def fast_settings(
    *,
    lease: dict[str, Any] | None = None,
    worker: dict[str, Any] | None = None,
    **overrides: Any,
) -> Settings:
    """Settings with short leases, sweeps and grace so tests settle within seconds."""
    lease_values = {
        "duration": 3.0,
        "renew_interval": 0.2,
        "sweep_interval": 0.3,
        "sweep_jitter": 0.0,
    }
    worker_values = {
        "grace_period": 1.0,
        "idle_block": 0.5,
        "process_pool_size": 1,
        "thread_pool_size": 4,
    }
    lease_values.update(lease or {})
    worker_values.update(worker or {})
    return load_settings(lease=lease_values, worker=worker_values, environ={}, **overrides)


def make_app(namespace: str, redis_url: str, **settings: Any) -> App:
    return App(namespace, redis_url=redis_url, settings=fast_settings(**settings))


@asynccontextmanager
async def running_workers(
    app: App,
    *,
    count: int = 1,
    lanes: Sequence[str] | None = None,
    concurrency: int = 10,
    stop_timeout: float = WAIT,
) -> AsyncIterator[list[Worker]]:
    """Run ``count`` workers of a connected ``app`` in this loop, in a TaskGroup; stop them on exit.

    An exception of the body is re-raised as itself (not wrapped in an ExceptionGroup)
    after the workers have stopped; a worker that crashes fails the test.
    """
    workers = [
        Worker(app, lanes=list(lanes or [app.settings.default_lane]), concurrency=concurrency)
        for _ in range(count)
    ]
    error: BaseException | None = None
    async with asyncio.timeout(None) as stopping, asyncio.TaskGroup() as group:
        for worker in workers:
            group.create_task(worker.run(), name=f"worker-{worker.id}")
        try:
            yield workers
        except BaseException as exc:
            error = exc
        finally:
            for worker in workers:
                worker.stop()
            stopping.reschedule(asyncio.get_running_loop().time() + stop_timeout)
    if error is not None:
        raise error


@asynccontextmanager
async def running_worker(
    app: App, *, lanes: Sequence[str] | None = None, concurrency: int = 10
) -> AsyncIterator[Worker]:
    async with running_workers(app, lanes=lanes, concurrency=concurrency) as workers:
        yield workers[0]


async def eventually(
    check: Callable[[], Awaitable[bool]], *, timeout: float = WAIT, every: float = 0.05
) -> None:
    """Wait until ``check()`` is true, failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {check}")
        await asyncio.sleep(every)


async def app_keys(redis_url: str, namespace: str, pattern: str = "*") -> set[bytes]:
    """Every key of an app matching ``pattern`` after its prefix (SCAN, never KEYS)."""
    client = create_client(redis_url)
    try:
        match = f"\\{{fl:{namespace}\\}}:{pattern}"
        return {key async for key in client.scan_iter(match=match, count=1000)}
    finally:
        await client.aclose()


def children_import_tests(monkeypatch: Any) -> None:
    """Let spawned children import ``tests.e2e.helpers`` whatever their working directory."""
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{path}" if path else str(ROOT))


# -- functions run by thread and process executors ---------------------------------------------


def sync_add(a: int, b: int) -> int:
    """A synchronous task body for the thread executor; reports the thread it ran on."""
    return a + b


def thread_name() -> str:
    return threading.current_thread().name


def sync_fail(message: str) -> None:
    raise LookupError(message)


def sync_unserializable() -> object:
    return object()


def sync_exit(code: int) -> None:
    sys.exit(code)


def cpu_square(n: int) -> dict[str, int]:
    """A CPU-bound task body for the process executor; reports the pid it ran in."""
    return {"square": n * n, "pid": os.getpid()}


def process_fail(message: str) -> None:
    raise KeyError(message)


def sleep_in_child(seconds: float, pid_file: str) -> None:
    """A process task that outlives its deadline; writes its child's pid first."""
    Path(pid_file).write_text(str(os.getpid()))
    time.sleep(seconds)


@asynccontextmanager
async def raw_client(url: str) -> AsyncIterator[Any]:
    """A plain client of ``url`` for reading keys and counters behind the app's back."""
    client = create_client(url)
    try:
        yield client
    finally:
        await client.aclose()


#: an app of one task, ``hello``, on the session's server, as a module a command imports
HELLO_APP = """
from fairlane import App
from tests.e2e.helpers import fast_settings

app = App({name!r}, redis_url={url!r}, settings=fast_settings())


@app.task
async def hello(n: int) -> int:
    return n
"""


def explain_command(
    tmp_path: Path, monkeypatch: Any, namespace: str, redis_url: str
) -> tuple[Any, str]:
    """``fairlane explain`` as a Typer app, and the spec of a module defining ``HELLO_APP``
    for ``namespace`` (written to ``tmp_path``, importable from there)."""
    import typer  # noqa: PLC0415 - only the command tests need it

    from fairlane.cli.explain import explain  # noqa: PLC0415

    module = f"explained_{namespace}"
    (tmp_path / f"{module}.py").write_text(HELLO_APP.format(name=namespace, url=redis_url))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    cli = typer.Typer()
    cli.command("explain")(explain)
    cli.command("noop")(lambda: None)  # two commands: the first is a subcommand, not the app
    return cli, f"{module}:app"
