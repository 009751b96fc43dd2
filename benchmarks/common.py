"""What Fairlane's benchmark scripts share: command counting, server statistics, workers.

Commands are counted twice. On the server, ``CONFIG RESETSTAT`` before a phase and
``INFO commandstats`` after it give every command the server executed, including the
ones run inside Lua scripts and functions. On the client, every process of the run
patches redis-py's asyncio ``pack_command`` (every command redis-py sends, pipelined,
pub/sub or connection handshake, is packed by it exactly once) and counts commands by
name; the producer counts into the sink of the current context, worker processes into
one process-wide sink that they report on request (SIGUSR1) and on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection

from fairlane.store.api import unlink_matching
from fairlane.store.sockets import HiredisPacking

DEFAULT_URL = "redis://127.0.0.1:6379/0"
REPO_ROOT = Path(__file__).resolve().parent.parent
# commands that take a sub-command, which commandstats names "container|sub"
_CONTAINERS = frozenset(
    {
        "acl",
        "client",
        "cluster",
        "command",
        "config",
        "function",
        "latency",
        "memory",
        "module",
        "object",
        "pubsub",
        "script",
        "slowlog",
        "xgroup",
        "xinfo",
    }
)
# commands the benchmark itself sends to take its measurements
MEASURING = frozenset({"info", "config|resetstat"})

_SINK: ContextVar[Counter[str] | None] = ContextVar("bench_command_sink", default=None)


class _Counting:
    """Whether ``pack_command`` is patched, and the sink of a worker process."""

    installed = False
    process_sink: Counter[str] | None = None


# -- client-side counting ---------------------------------------------------------------


def command_name(args: tuple[Any, ...]) -> str:
    """The commandstats name of a command: ``fcall``, ``client|setinfo``..."""
    words: list[str] = []
    for arg in args[:2]:
        text = arg.decode() if isinstance(arg, bytes | bytearray) else str(arg)
        words.extend(text.lower().split())
    if len(words) > 1 and words[0] in _CONTAINERS:
        return f"{words[0]}|{words[1]}"
    return words[0] if words else "?"


def install_counter(*, process_wide: bool = False) -> Counter[str] | None:
    """Count every command this process sends; returns the process-wide sink if asked for."""
    if process_wide and _Counting.process_sink is None:
        _Counting.process_sink = Counter()
    if not _Counting.installed:
        # Fairlane's connections pack with hiredis (HiredisPacking); others with redis-py
        for cls in (AbstractConnection, HiredisPacking):
            _count_packing(cls)
        _Counting.installed = True
    return _Counting.process_sink


def _count_packing(cls: type[Any]) -> None:
    original = cls.pack_command

    def pack_command(self: Any, *args: Any) -> list[bytes]:
        sink = _SINK.get()
        if sink is None:
            sink = _Counting.process_sink
        if sink is not None:
            sink[command_name(args)] += 1
        result: list[bytes] = original(self, *args)
        return result

    cls.pack_command = pack_command


@contextlib.contextmanager
def counting(sink: Counter[str]) -> Iterator[Counter[str]]:
    """Count the commands sent from this context (and tasks it starts) into ``sink``."""
    install_counter()
    token = _SINK.set(sink)
    try:
        yield sink
    finally:
        _SINK.reset(token)


# -- server-side statistics --------------------------------------------------------------


class Meter:
    """The benchmark's own connection: resets and reads server statistics, polls progress.

    Its commands are counted apart and taken out of the figures it reports.
    """

    def __init__(self, url: str) -> None:
        self.client = aioredis.Redis.from_url(url, decode_responses=False)
        self.sink: Counter[str] = Counter()
        self._base: Counter[str] = Counter()

    @contextlib.contextmanager
    def own(self) -> Iterator[None]:
        with counting(self.sink):
            yield

    async def reset(self) -> None:
        """Zero the server's command statistics (``CONFIG RESETSTAT``)."""
        with self.own():
            await self.client.config_resetstat()
        self._base = Counter(self.sink)

    async def calls(self) -> Counter[str]:
        """Calls per command since ``reset``, without the meter's own commands."""
        with self.own():
            raw = await self.client.info("commandstats")
        calls: Counter[str] = Counter()
        for key, value in raw.items():
            name = key.removeprefix("cmdstat_")
            if name not in MEASURING:
                calls[name] = int(value["calls"])
        calls.subtract(self.sink - self._base)
        return +calls  # drops entries at or below zero

    async def server_info(self) -> dict[str, Any]:
        with self.own():
            info: dict[str, Any] = await self.client.info("server")
        return info

    async def aclose(self) -> None:
        await self.client.aclose()


def script_commands(*sources: str) -> frozenset[str]:
    """The commands that Lua sources run with ``redis.call``/``redis.pcall``."""
    found = re.findall(r"redis\.p?call\(\s*['\"]([A-Za-z|]+)['\"]", "\n".join(sources))
    return frozenset(name.lower() for name in found)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# -- worker processes --------------------------------------------------------------------


def emit(event: str, **fields: Any) -> None:
    """Write one event line for the parent (used by the worker scripts)."""
    sys.stdout.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")
    sys.stdout.flush()


class WorkerProcess:
    """A worker script run as ``python -m <module> ...``, talking JSON lines on stdout."""

    def __init__(self, module: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.module, self.args = module, args
        self.env = {**os.environ, **(env or {})}
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), self.env.get("PYTHONPATH", "")) if p
        )
        self.proc: asyncio.subprocess.Process | None = None
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self, timeout: float = 60.0) -> float:
        """Start the process; returns its ``ready`` time (epoch seconds)."""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            self.module,
            *self.args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._log,
            env=self.env,
            cwd=REPO_ROOT,
        )
        ready = await self.next_event("ready", timeout)
        return float(ready["t"])

    async def next_event(self, name: str, timeout: float = 60.0) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    await self.proc.wait()
                    raise RuntimeError(
                        f"{self.module} exited ({self.proc.returncode}) "
                        f"before '{name}':\n{self.log_tail()}"
                    )
                event: dict[str, Any] = json.loads(line)
                if event.get("event") == name:
                    return event

    async def counts(self) -> Counter[str]:
        """The commands the worker has sent so far."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGUSR1)
        return Counter(dict((await self.next_event("counts", 30.0))["commands"]))

    async def stop(self, timeout: float = 60.0) -> Counter[str]:
        """SIGTERM (graceful), then the commands it sent in all; kills it after ``timeout``."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await self.exited(timeout)

    async def exited(self, timeout: float = 120.0) -> Counter[str]:
        """Wait for the process to exit on its own; returns the commands it sent."""
        try:
            event = await self.next_event("exit", timeout)
        except TimeoutError:
            self.kill()
            raise TimeoutError(
                f"{self.module} did not exit within {timeout:.0f}s:\n{self.log_tail()}"
            ) from None
        assert self.proc is not None
        await self.proc.wait()
        return Counter(dict(event["commands"]))

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()

    def log_tail(self, lines: int = 30) -> str:
        self._log.seek(0)
        return "\n".join(self._log.read().decode(errors="replace").splitlines()[-lines:])

    async def close(self) -> None:
        self.kill()
        if self.proc is not None:
            await self.proc.wait()
        self._log.close()


async def wait_until(
    check: Callable[[], Awaitable[bool]], *, interval: float = 0.005, timeout: float = 600.0
) -> float:
    """Poll the coroutine function ``check`` until it is truthy; returns that moment."""
    deadline = time.monotonic() + timeout
    while True:
        if await check():
            return time.time()
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout:.0f}s waiting for the workers")
        await asyncio.sleep(interval)


async def delete_matching(client: aioredis.Redis, pattern: str) -> int:
    """Delete every key matching ``pattern`` (the benchmark cleans up its namespaces)."""
    return await unlink_matching(client, pattern)


async def serving(
    app: Any, body: Callable[[], Awaitable[Any]], *, workers: int = 2, concurrency: int = 16
) -> Any:
    """Run ``body`` while ``workers`` in-process workers of ``app`` (connected) serve the
    default lane; they stop when it ends."""
    from fairlane.app.worker import Worker  # noqa: PLC0415 - only the in-process benches

    running = [Worker(app, lanes=["default"], concurrency=concurrency) for _ in range(workers)]
    async with asyncio.TaskGroup() as group:
        for w in running:
            group.create_task(w.run())
        try:
            return await body()
        finally:
            for w in running:
                w.stop()
