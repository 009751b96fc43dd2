"""``fairlane worker --processes N``: N supervised workers, restarted when killed, stopped together.

The end-to-end test runs the real command (``python -m fairlane.cli worker ... --processes
2``) against the test server, with an app written to a temporary module: both children
register as workers; a SIGKILLed child is replaced by a new worker that registers, while
the jobs (some in flight on the killed child) all complete; SIGTERM to the supervisor stops
every child and the supervisor exits 0. Two quick tests drive :class:`Supervisor` on
throw-away commands (no server) for the restart count and a fatal exit code; one checks
the usage errors. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import psutil
import pytest
from typer.testing import CliRunner

from fairlane.cli import cli
from fairlane.runtime.supervisor import Supervisor

WAIT = 15.0  # s: upper bound of any single wait below
GRACE = 2.0  # s: the app's worker.grace_period

APP_SOURCE = """
import asyncio
import os
from pathlib import Path

from fairlane import App
from fairlane.config.settings import load_settings

settings = load_settings(
    project_dir=Path(__file__).parent,
    environ={{}},
    lease={{"duration": 1.5, "renew_interval": 0.3, "sweep_interval": 0.5}},
    worker={{"grace_period": {grace}, "idle_block": 0.5}},
)
app = App({name!r}, redis_url={url!r}, settings=settings)


@app.task(attempts=5)
async def work(n: int, pause: float) -> int:
    await asyncio.sleep(pause)
    return os.getpid()
"""


@pytest.fixture
def project(
    tmp_path: Path, namespace: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ModuleType]:
    """A module ``<namespace>_app`` in a temporary working directory, imported here too."""
    name = f"{namespace}_app"
    source = APP_SOURCE.format(name=namespace, url=redis_url, grace=GRACE)
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    try:
        yield importlib.import_module(name)
    finally:
        sys.modules.pop(name, None)


def clean_env() -> dict[str, str]:
    """This environment without FAIRLANE_ settings, and wide enough for one log line a record."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRLANE_")}
    env["COLUMNS"] = "250"
    return env


async def eventually(check: Callable[[], Awaitable[Any]], what: str, timeout: float = WAIT) -> Any:
    """Poll ``check`` until it returns a true value, and return it; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await anyio.sleep(0.05)


def live_children(proc: subprocess.Popen[bytes], seen: dict[int, psutil.Process]) -> set[int]:
    """Pids of ``proc``'s children that are running (a zombie not yet reaped is not).

    Each child is also put in ``seen``, so the test can kill any that outlives its parent.
    """
    pids = set()
    for child in psutil.Process(proc.pid).children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                pids.add(child.pid)
                seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass
    return pids


async def registered(project: ModuleType) -> set[int]:
    """Pids of the app's workers in the ``workers`` zset (ids are host:pid:random)."""
    store = project.app.store
    members = await store.client.zrange(store.keys.workers, 0, -1)
    return {int(m.decode().split(":")[-2]) for m in members}


@contextlib.contextmanager
def supervisor_process(
    args: list[str], cwd: Path, log_path: Path, seen: dict[int, psutil.Process]
) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m fairlane.cli ARGS`` in ``cwd``; it and every child in ``seen`` killed if
    left running, so that a broken supervisor cannot leave orphaned workers behind."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fairlane.cli", *args],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=clean_env(),
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=WAIT)
        for child in seen.values():  # psutil checks the pid was not reused since
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        print(log_path.read_text()[-3000:])  # shown when the test fails


@pytest.mark.anyio
@pytest.mark.embedded_only
async def test_processes_supervises_restarts_and_stops(
    project: ModuleType, redis_url: str, tmp_path: Path
) -> None:
    log_path = tmp_path / "supervisor.log"
    seen: dict[int, psutil.Process] = {}
    args = [
        "worker",
        f"{project.__name__}:app",
        "--processes",
        "2",
        "--concurrency",
        "4",
        "--redis-url",
        redis_url,
    ]
    with supervisor_process(args, tmp_path, log_path, seen) as proc:
        async with project.app:
            # (1) two children, each a worker that registers
            async def both_registered() -> set[int] | None:
                assert proc.poll() is None, log_path.read_text()
                children = live_children(proc, seen)
                if len(children) == 2 and children <= await registered(project):
                    return children
                return None

            first = await eventually(both_registered, "2 registered worker processes")

            # (2) SIGKILL one child while jobs run: it is replaced, and every job completes
            jobs = [await project.work.enqueue(n, 0.3) for n in range(40)]
            stats = project.app.stats

            async def working() -> bool:
                return bool((await stats()).get("completed", 0) >= 4)

            await eventually(working, "the first jobs to complete")
            victim = min(first)
            os.kill(victim, signal.SIGKILL)

            async def replaced() -> set[int] | None:
                assert proc.poll() is None, log_path.read_text()
                children = live_children(proc, seen)
                if len(children) == 2 and victim not in children:
                    new = children - first
                    if new and new <= await registered(project):
                        return children
                return None

            second = await eventually(replaced, "a registered replacement of the killed child")
            assert len(second - first) == 1 and (first - {victim}) <= second
            results = [await job.result(timeout=WAIT) for job in jobs]
            assert set(results) <= first | second
            assert (await stats()).get("completed", 0) >= len(jobs)
            text = log_path.read_text()
            assert f"(pid {victim}) died" in text and "killed by SIGKILL" in text, text
            assert "(restart 1)" in text, text

            # (3) SIGTERM to the supervisor stops every child; it exits 0
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = await anyio.to_thread.run_sync(functools.partial(proc.wait, GRACE + 8))
            assert code == 0, log_path.read_text()
            assert time.monotonic() - started < GRACE + 8
            assert not any(seen[pid].is_running() for pid in second), "a child outlived it"
            # the children stopped gracefully: each left the workers zset on the way out
            assert not (second & await registered(project)), log_path.read_text()


def _python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def test_crash_loop_is_restarted_with_backoff_until_clean_exit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # each child records itself; the first two (one per slot) crash, later ones exit 0
    code = (
        "import os, sys\n"
        "d = sys.argv[1]\n"
        "seen = len(os.listdir(d))\n"
        "open(os.path.join(d, str(os.getpid())), 'w').close()\n"
        "sys.exit(3 if seen < 2 else 0)\n"
    )
    supervisor = Supervisor(
        _python(code, str(tmp_path)), 2, backoff_initial=0.1, backoff_cap=0.2, poll_interval=0.02
    )
    caplog.set_level(logging.INFO, logger="fairlane.supervisor")
    started = time.monotonic()
    assert supervisor.run() == 0
    assert time.monotonic() - started < WAIT
    assert supervisor.restarts == 2
    assert len(list(tmp_path.iterdir())) == 4
    assert caplog.text.count("exit code 3; restarting it in 0.1s") == 2, caplog.text
    assert supervisor.pids == []


def test_a_fatal_exit_code_stops_the_other_children(tmp_path: Path) -> None:
    # the first child to start exits 2 (a usage error); the other would sleep a minute
    code = (
        "import os, sys, time\n"
        "try:\n"
        "    os.close(os.open(os.path.join(sys.argv[1], 'first'), os.O_CREAT | os.O_EXCL))\n"
        "except FileExistsError:\n"
        "    time.sleep(60)\n"
        "sys.exit(2)\n"
    )
    supervisor = Supervisor(
        _python(code, str(tmp_path)), 2, grace_period=1.0, poll_interval=0.02, fatal_exit_codes=[2]
    )
    started = time.monotonic()
    assert supervisor.run() == 2
    assert time.monotonic() - started < WAIT
    assert supervisor.restarts == 0
    assert supervisor.pids == [], "the sleeping child was not stopped"


@pytest.mark.parametrize("other", [["--reload"], ["--check"], ["--health-port", "8123"]])
def test_processes_refuses_reload_check_and_health_port(other: list[str]) -> None:
    result = CliRunner().invoke(cli, ["worker", "some_module:app", "--processes", "2", *other])
    assert result.exit_code == 2, result.output
    assert "--processes cannot be combined with" in result.output
