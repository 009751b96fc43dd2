"""Tests for fairlane.runtime.executors against real child processes and threads (no mocks)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import psutil
import pytest

from fairlane.runtime.executors import (
    ChildCrashed,
    ExecutionTimeout,
    ExecutorClosed,
    ExecutorError,
    ProcessExecutor,
    RemoteError,
    ThreadExecutor,
)
from tests.runtime import _child_funcs

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
FUNCS = "tests.runtime._child_funcs"
INVOKER = f"{FUNCS}:invoke"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _children_can_import_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spawned children must be able to import ``tests.runtime._child_funcs``."""
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{path}" if path else str(ROOT))


async def call(ex: ProcessExecutor, func: str, *args: Any, limit: float | None = 10) -> Any:
    result = await ex.run(f"{FUNCS}:{func}", msgspec.json.encode(list(args)), limit)
    return msgspec.json.decode(result)


def pid_gone(pid: int) -> bool:
    """True once ``pid`` no longer exists, not even as a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_round_trip_and_stats() -> None:
    async with ProcessExecutor(2, INVOKER) as ex:
        assert await call(ex, "echo", 1, "two", [3]) == [1, "two", [3]]
        assert await call(ex, "getpid") != os.getpid()
        assert await call(ex, "sigint_ignored") is True
        stats = ex.statistics()
        assert (stats.size, stats.busy, stats.idle) == (2, 0, 2)
        assert (stats.restarts, stats.crashes, stats.timeouts) == (0, 0, 0)


async def test_forkserver_round_trip() -> None:
    async with ProcessExecutor(1, INVOKER, start_method="forkserver") as ex:
        assert await call(ex, "echo", "hi") == ["hi"]


def test_fork_is_refused() -> None:
    with pytest.raises(ValueError, match="spawn"):
        ProcessExecutor(1, INVOKER, start_method="fork")


async def test_bad_invoker_fails_start() -> None:
    ex = ProcessExecutor(1, f"{FUNCS}:no_such_invoker")
    with pytest.raises(ExecutorError, match="AttributeError"):
        await ex.start()
    with pytest.raises(ExecutorClosed):
        await call(ex, "getpid")


async def test_remote_error_keeps_child() -> None:
    async with ProcessExecutor(1, INVOKER) as ex:
        pid = await call(ex, "getpid")
        with pytest.raises(RemoteError) as info:
            await call(ex, "fail", "boom")
        err = info.value
        assert (err.type_name, err.message) == ("ValueError", "boom")
        assert "Traceback" in err.traceback
        assert "in fail" in err.traceback
        assert await call(ex, "getpid") == pid
        assert ex.statistics().restarts == 0


@pytest.mark.parametrize(
    ("func", "args", "exitcode"),
    [
        ("segfault", [], -signal.SIGSEGV),
        ("hard_exit", [3], 3),
        ("self_kill", [], -signal.SIGKILL),
    ],
)
async def test_crash_is_reported_and_child_replaced(
    func: str, args: list[Any], exitcode: int
) -> None:
    async with ProcessExecutor(1, INVOKER) as ex:
        pid = await call(ex, "getpid")
        with pytest.raises(ChildCrashed) as info:
            await call(ex, func, *args)
        assert info.value.exitcode == exitcode
        assert pid_gone(pid)
        new_pid = await call(ex, "getpid")
        assert new_pid != pid
        stats = ex.statistics()
        assert (stats.crashes, stats.restarts, stats.timeouts) == (1, 1, 0)


async def test_timeout_kills_and_replaces() -> None:
    async with ProcessExecutor(1, INVOKER) as ex:
        pid = await call(ex, "getpid")
        started = time.monotonic()
        with pytest.raises(ExecutionTimeout):
            await call(ex, "sleep_then_pid", 30, limit=0.3)
        assert time.monotonic() - started < 5
        assert pid_gone(pid)
        assert await call(ex, "getpid") not in (pid, os.getpid())
        stats = ex.statistics()
        assert (stats.timeouts, stats.restarts, stats.crashes) == (1, 1, 0)


async def test_two_children_run_in_parallel_and_a_third_call_waits() -> None:
    async with ProcessExecutor(2, INVOKER) as ex:
        finished: list[float] = []
        pids: list[int] = []

        async def one() -> None:
            pids.append(await call(ex, "sleep_then_pid", 0.6))
            finished.append(time.monotonic() - started)

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(one)
            await anyio.sleep(0.3)
            stats = ex.statistics()
            assert (stats.busy, stats.idle) == (2, 0)
        assert len(set(pids)) == 2
        assert finished[1] < 1.1  # the first two ran side by side
        assert finished[2] >= 1.15  # the third waited for a free child


async def test_cancellation_kills_the_child() -> None:
    async with ProcessExecutor(1, INVOKER) as ex:
        pid = await call(ex, "getpid")
        with anyio.move_on_after(0.3) as scope:
            await call(ex, "sleep_then_pid", 30)
        assert scope.cancelled_caught
        for _ in range(500):  # the cancelled call's child is reaped in the background
            if pid_gone(pid):
                break
            await anyio.sleep(0.01)
        assert pid_gone(pid)
        assert await call(ex, "getpid") != pid
        assert ex.statistics().restarts == 1


async def test_waiting_for_a_child_is_cancellable() -> None:
    async with ProcessExecutor(1, INVOKER) as ex:
        async with anyio.create_task_group() as tg:
            tg.start_soon(call, ex, "sleep_then_pid", 0.5)
            await anyio.sleep(0.1)
            with anyio.move_on_after(0.1):
                await call(ex, "getpid")  # waits for the busy child, then gives up
        assert await call(ex, "echo", 1) == [1]
        assert ex.statistics().restarts == 0


async def test_aclose_leaves_no_children() -> None:
    ex = ProcessExecutor(3, INVOKER)
    await ex.start()
    async with anyio.create_task_group() as tg:
        pids: list[int] = []

        async def one() -> None:
            pids.append(await call(ex, "sleep_then_pid", 0.3))

        for _ in range(3):
            tg.start_soon(one)
    assert len(set(pids)) == 3
    await ex.aclose()
    assert all(pid_gone(pid) for pid in pids)
    live = [p for p in psutil.Process().children() if p.pid in pids]
    assert live == []
    with pytest.raises(ExecutorClosed):
        await call(ex, "getpid")


async def test_aclose_kills_a_busy_child_after_grace() -> None:
    ex = ProcessExecutor(1, INVOKER)
    await ex.start()
    pid = await call(ex, "getpid")
    outcome: list[BaseException] = []

    async def busy() -> None:
        try:
            await call(ex, "sleep_then_pid", 30)
        except ExecutorError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(busy)
        await anyio.sleep(0.2)
        started = time.monotonic()
        await ex.aclose(grace=0.3)
        assert time.monotonic() - started < 5
    assert pid_gone(pid)
    assert len(outcome) == 1
    assert isinstance(outcome[0], ExecutorClosed)


async def test_replacing_children_leaks_no_fds() -> None:
    async with ProcessExecutor(1, INVOKER) as ex:
        await call(ex, "getpid")
        before = open_fds()
        for _ in range(3):
            with pytest.raises(ChildCrashed):
                await call(ex, "hard_exit", 1)
            with pytest.raises(ExecutionTimeout):
                await call(ex, "sleep_then_pid", 30, limit=0.1)
        await call(ex, "getpid")
        assert open_fds() == before


async def test_thread_round_trip() -> None:
    ex = ThreadExecutor(2)
    try:
        payload = msgspec.json.encode([1, 2])
        result = await ex.run(_child_funcs.invoke, f"{FUNCS}:echo", payload, 5)
        assert msgspec.json.decode(result) == [1, 2]
        with pytest.raises(ValueError, match="boom"):
            await ex.run(_child_funcs.invoke, f"{FUNCS}:fail", b'["boom"]', 5)
    finally:
        await ex.aclose()


async def test_thread_timeout() -> None:
    ex = ThreadExecutor(1)
    release = threading.Event()

    def blocked(target: str, payload: bytes) -> bytes:
        release.wait(10)
        return b"late"

    try:
        started = time.monotonic()
        with pytest.raises(ExecutionTimeout):
            await ex.run(blocked, "t", b"", 0.2)
        assert time.monotonic() - started < 2
    finally:
        release.set()
        await ex.aclose()


async def test_thread_pool_is_bounded() -> None:
    ex = ThreadExecutor(1)
    active = 0
    peak = 0
    lock = threading.Lock()

    def work(target: str, payload: bytes) -> bytes:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        time.sleep(0.1)
        with lock:
            active -= 1
        return payload

    try:
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(ex.run, work, "t", bytes([i]), 5)
        assert peak == 1
    finally:
        await ex.aclose()
    with pytest.raises(ExecutorClosed):
        await ex.run(work, "t", b"", 1)
