"""A worker process for the fault tests, plus the helpers the tests drive it with.

Run it as ``python -m tests.faults.worker_proc`` from the repository root; it is
configured entirely by the environment variables ``worker_env`` writes (all of them;
the other fault apps read the same ones, through ``process_options``):

================  ===========================================  =======
variable          meaning                                      default
================  ===========================================  =======
FLT_APP           app name (the test's namespace)              --
FLT_URL           server URL                                   --
FLT_LEDGER        key of the ledger list tasks append to       --
FLT_LEASE         lease duration, s                            1.5
FLT_RENEW         lease renewal interval, s                    0.3
FLT_SWEEP         reclaim sweep interval, s                    0.5
FLT_CONCURRENCY   jobs run at once                             8
FLT_PROCESSES     process-pool size; 0 registers no process    0
                  tasks (so no pool is started)
FLT_SHARDS        the app's scheduling shards                  1
FLT_HEALTH_PORT   the worker's ``/health`` port (read by       none
                  ``main`` only; written when given)
================  ===========================================  =======

The tasks are registered under fixed names, so the test process (which builds the
same app with ``build_app`` to enqueue) and the worker agree on them; every task
retries at once (backoff 0) so reclaims and retries do not wait. Tasks write to the
ledger before they return: that is the record of what actually ran, and where.
``armed`` and ``stall`` wait, once started, until the test sets the ledger's ``go``
key (``go_key``), so the test chooses the moment they hold or block.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import logging
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from fairlane.app import App
from fairlane.app.task import Task
from fairlane.config.settings import Settings, load_settings
from fairlane.policy.backoff import Backoff
from fairlane.policy.retention import Retention

__all__ = [
    "FaultTasks",
    "Fleet",
    "build_app",
    "eventually",
    "fault_settings",
    "go_key",
    "held_by",
    "main",
    "process_options",
    "quick_app",
    "serve_with_ledger",
    "server_ms",
    "wait_ready",
    "worker_env",
]

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
NO_WAIT = Backoff(0, 0, "none")
KEEP_ALL = Retention(completed=None, failed=None)
T = TypeVar("T")

# set in the worker process by main(); the tasks below only ever run there
_ctx: dict[str, Any] = {}


async def _ledger(entry: str) -> None:
    await _ctx["app"].store.client.rpush(_ctx["ledger"], entry)


# -- async tasks (run on the worker's event loop) -------------------------------------


async def record(n: int, pause: float) -> int:
    """Work a little, then note that job ``n`` ran here, before returning."""
    await asyncio.sleep(pause)
    await _ledger(f"{n}:{os.getpid()}")
    return n


async def hold(seconds: float, tag: str) -> int:
    """Note the start, then hold the job until ``seconds`` after it began; returns the pid.

    The end is a point in time, not a length: a worker frozen (SIGSTOP) past it and then
    thawed finishes the attempt at its next step, with nothing left to await, before it
    can hear from the server that its lease is gone.
    """
    end = time.monotonic() + seconds
    await _ledger(f"{tag}:{os.getpid()}")
    remaining = end - time.monotonic()
    if remaining > 0:
        await asyncio.sleep(remaining)
    return os.getpid()


def go_key(ledger: str) -> str:
    """The key a test sets to release the ``armed`` and ``stall`` tasks."""
    return ledger + ":go"


async def _until_go() -> None:
    client, key = _ctx["app"].store.client, go_key(_ctx["ledger"])
    while True:  # polled: the test's process sets it
        if await client.exists(key):
            return
        await asyncio.sleep(0.02)


async def armed(seconds: float, tag: str) -> int:
    """Note the start; once the test says go, note that, and end ``seconds`` after it (a
    point in time, as ``hold``'s end); returns the pid."""
    await _ledger(f"{tag}:{os.getpid()}")
    await _until_go()
    end = time.monotonic() + seconds
    await _ledger(f"{tag}-armed:{os.getpid()}")
    remaining = end - time.monotonic()
    if remaining > 0:
        await asyncio.sleep(remaining)
    return os.getpid()


async def stall(seconds: float, tag: str) -> int:
    """Note the start; once the test says go, block the worker's event loop for
    ``seconds``, as a blocking call in an async task does (a sync SDK call, a large
    parse), noting just before and just after; returns the pid."""
    await _ledger(f"{tag}:{os.getpid()}")
    await _until_go()
    await _ledger(f"{tag}-blocking:{os.getpid()}")
    time.sleep(seconds)  # noqa: ASYNC251 - blocking the loop is the point
    await _ledger(f"{tag}-free:{os.getpid()}")
    return os.getpid()


async def suicide() -> None:
    """A poison job: it kills the worker that runs it."""
    await _ledger(f"suicide:{os.getpid()}")
    os.kill(os.getpid(), signal.SIGKILL)
    await asyncio.sleep(60)


async def whoami() -> int:
    return os.getpid()


# -- sync tasks for the process pool (module level: children import them by name) ----


def segfault() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the work tree
    ctypes.string_at(0)


def hard_exit() -> None:
    os._exit(1)


def nap(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def square(x: int) -> int:
    return x * x


@dataclass(frozen=True)
class FaultTasks:
    record: Task[[int, float], int]
    hold: Task[[float, str], int]
    armed: Task[[float, str], int]
    stall: Task[[float, str], int]
    suicide: Task[[], None]
    whoami: Task[[], int]
    segfault: Task[[], None] | None = None
    hard_exit: Task[[], None] | None = None
    nap: Task[[float], int] | None = None
    square: Task[[int], int] | None = None


def build_app(
    name: str,
    url: str,
    *,
    lease: float = 1.5,
    renew: float = 0.3,
    sweep: float = 0.5,
    concurrency: int = 8,
    processes: int = 0,
    shards: int = 1,
    health_port: int | None = None,
) -> tuple[App, FaultTasks]:
    """The fault tests' app; with ``processes`` it has process tasks (and a pool of that
    size); with ``health_port`` its worker serves ``/health`` there."""
    settings = fault_settings(
        url,
        lease={"duration": lease, "renew_interval": renew, "sweep_interval": sweep},
        worker={
            "concurrency": concurrency,
            "grace_period": 2.0,
            "idle_block": 1.0,
            "process_pool_size": max(processes, 1),
            "health_port": health_port,
        },
    )
    app = App(name, redis_url=url, settings=settings, shards=shards)

    def task(**options: Any) -> Any:  # every record is kept: the tests inspect them all
        return app.task(retention=KEEP_ALL, **options)

    timeout = 60.0
    tasks = FaultTasks(
        record=task(name="record", attempts=3, backoff=NO_WAIT, timeout=timeout)(record),
        hold=task(name="hold", attempts=3, backoff=NO_WAIT, timeout=timeout)(hold),
        armed=task(name="armed", attempts=3, backoff=NO_WAIT, timeout=timeout)(armed),
        stall=task(name="stall", attempts=3, backoff=NO_WAIT, timeout=timeout)(stall),
        suicide=task(name="suicide", attempts=3, backoff=NO_WAIT, timeout=timeout)(suicide),
        whoami=task(name="whoami", attempts=1, timeout=timeout)(whoami),
    )
    if processes:
        proc = {"attempts": 2, "backoff": NO_WAIT, "executor": "process"}
        tasks = FaultTasks(
            record=tasks.record,
            hold=tasks.hold,
            armed=tasks.armed,
            stall=tasks.stall,
            suicide=tasks.suicide,
            whoami=tasks.whoami,
            segfault=task(name="segfault", timeout=timeout, **proc)(segfault),
            hard_exit=task(name="hard_exit", timeout=timeout, **proc)(hard_exit),
            nap=task(name="nap", timeout=1.0, **proc)(nap),
            square=task(name="square", timeout=timeout, **proc)(square),
        )
    return app, tasks


def fault_settings(url: str, **sections: Any) -> Settings:
    """Settings of a fault test's app: this directory's, no ``FAIRLANE_`` variables."""
    return load_settings(project_dir=HERE, environ={}, redis_url=url, **sections)


def quick_app(
    name: str, url: str, *, lease: float, renew: float, sweep: float, concurrency: int, shards: int
) -> App:
    """An app for the kill tests' own worker apps: sweeps without jitter, and a short
    grace and idle block, so that kills and recoveries follow each other quickly."""
    settings = fault_settings(
        url,
        lease={
            "duration": lease,
            "renew_interval": renew,
            "sweep_interval": sweep,
            "sweep_jitter": 0.0,
        },
        worker={"concurrency": concurrency, "grace_period": 1.0, "idle_block": 0.5},
    )
    return App(name, redis_url=url, settings=settings, shards=shards)


def process_options() -> dict[str, Any]:
    """In a fault test's worker process: set up its log, and read the app's options
    from the ``FLT_`` variables (``worker_env`` writes them all)."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    env = os.environ
    return {
        "name": env["FLT_APP"],
        "url": env["FLT_URL"],
        "lease": float(env["FLT_LEASE"]),
        "renew": float(env["FLT_RENEW"]),
        "sweep": float(env["FLT_SWEEP"]),
        "concurrency": int(env["FLT_CONCURRENCY"]),
        "shards": int(env["FLT_SHARDS"]),
    }


async def serve_with_ledger(app: App, ctx: dict[str, Any]) -> None:
    """Run the worker of a fault test's app whose tasks write to the ledger keys under
    ``FLT_LEDGER``, through the app's own client (kept in ``ctx``)."""
    async with app:
        ctx.update(prefix=os.environ["FLT_LEDGER"], client=app.store.client)
        await app.run_worker(handle_signals=True)


def main() -> None:
    options = process_options()
    health = os.environ.get("FLT_HEALTH_PORT")
    app, _ = build_app(
        processes=int(os.environ["FLT_PROCESSES"]),
        health_port=None if health is None else int(health),
        **options,
    )
    _ctx.update(app=app, ledger=os.environ["FLT_LEDGER"])
    asyncio.run(app.run_worker(handle_signals=True))


# -- the test side ---------------------------------------------------------------------


def worker_env(
    app: str,
    url: str,
    ledger: str,
    *,
    lease: float = 1.5,
    renew: float = 0.3,
    sweep: float = 0.5,
    concurrency: int = 8,
    processes: int = 0,
    shards: int = 1,
    health_port: int | None = None,
) -> dict[str, str]:
    """The environment of a worker process (no ``FAIRLANE_`` variables leak in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRLANE_")}
    path = env.get("PYTHONPATH")
    env.update(
        PYTHONPATH=f"{ROOT}{os.pathsep}{path}" if path else str(ROOT),
        FLT_APP=app,
        FLT_URL=url,
        FLT_LEDGER=ledger,
        FLT_LEASE=str(lease),
        FLT_RENEW=str(renew),
        FLT_SWEEP=str(sweep),
        FLT_CONCURRENCY=str(concurrency),
        FLT_SHARDS=str(shards),
        FLT_PROCESSES=str(processes),
    )
    if health_port is not None:
        env["FLT_HEALTH_PORT"] = str(health_port)
    return env


class Fleet:
    """Worker processes started by one test; every one is stopped and reaped on exit."""

    def __init__(
        self, env: dict[str, str], log_dir: Path, module: str = "tests.faults.worker_proc"
    ) -> None:
        self.env = env
        self.log_dir = log_dir
        self.module = module  # the worker process's entry point (``python -m module``)
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115
        self._logs.append(log)
        proc = subprocess.Popen(
            [sys.executable, "-m", self.module],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL, as a crash or the OOM killer would; returns once it is reaped."""
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)  # a stopped worker cannot handle SIGTERM
                    proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for log in self._logs:
            log.close()
        for path in sorted(self.log_dir.glob("worker-*.log")):
            tail = path.read_text(errors="replace").splitlines()[-15:]
            print(f"--- {path.name} (last lines)", *tail, sep="\n")  # shown when a test fails


async def eventually(
    probe: Callable[[], Awaitable[T | None]], what: str, timeout: float, step: float = 0.02
) -> T:
    """Poll ``probe`` until it returns a true value, and return that value; bounded."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(step)


async def server_ms(app: App) -> int:
    sec, usec = await app.store.client.time()
    return int(sec) * 1000 + int(usec) // 1000


async def wait_ready(app: App, pid: int, timeout: float = 30.0) -> None:
    """Wait until the worker process ``pid`` has registered (its first lease renewal)."""

    async def registered() -> bool:
        members = await app.store.client.zrange(app.store.keys.workers, 0, -1)
        return any(f":{pid}:".encode() in m for m in members)

    await eventually(registered, f"worker {pid} to register", timeout, step=0.05)


async def held_by(app: App, pid: int) -> set[str]:
    """Ids of the jobs whose lease is held by the worker process ``pid``, in every shard."""
    held: set[str] = set()
    mark = f":{pid}:".encode()
    for store in app.stores:
        client, keys = store.client, store.keys
        ids = [i.decode() for i in await client.zrange(keys.leases, 0, -1)]
        if not ids:
            continue
        pipe = client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(keys.job(job_id), "wk")
        owners = await pipe.execute()
        held |= {i for i, wk in zip(ids, owners, strict=True) if wk and mark in wk}
    return held


if __name__ == "__main__":
    # Run the copy imported under the module's real name, so that the task functions'
    # import paths (which process-pool children resolve) are tests.faults.worker_proc:...
    importlib.import_module("tests.faults.worker_proc").main()
