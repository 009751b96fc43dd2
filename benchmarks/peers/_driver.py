"""The harness every system's driver shares: its protocol, its processes and its scenarios.

Standard library only: each driver runs with the Python of its own system's virtual
environment (``benchmarks/venvs.py`` makes them), where neither Fairlane nor the other
peers are installed. A driver is a script, ``<system>_driver.py``, that defines an
:class:`Adapter` for its system (how to enqueue, how to tell that a queue is drained,
how to run a worker) and calls :func:`main`. The scenarios below are written once,
against that adapter, so that every system is timed by the same code.

Protocol (JSON lines on stdout; stderr is free-form and kept for error reports)::

    python X_driver.py run SCENARIO PARAMS   -> ... {"event": "result", "figures": {...}}
    python X_driver.py worker PARAMS         -> {"event": "ready", "t": ...}, then runs
                                                 until SIGTERM
    python X_driver.py versions              -> {"event": "versions", "versions": {...}}

``PARAMS`` is a JSON object, or ``-``: the first line of stdin (which keeps the server
URL, password included, out of the process list). A failed run exits non-zero after
``{"event": "error", "message": ...}``. The producer (``run``) starts the worker itself,
as another process of the same Python and script. With ``"handshake": true`` in its
parameters, ``run`` prints ``{"event": "measured"}`` once the scenario is over (worker
stopped, before its clean-up) and waits for a line on stdin: the caller reads the
server's statistics then.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import logging
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

Params = dict[str, Any]
POLL = 0.005  # how often the producer checks whether the queue is drained (s)
PAIR_TAG = "tag"  # the second argument of every ``pair`` job: a short string
SETTLE = 0.5  # seconds the server gets, before a memory reading, to finish growing its tables
STOP_GRACE = 5.0  # seconds a worker gets to stop after SIGTERM before it is killed


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")
    sys.stdout.flush()


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def delays_ms(delays: Sequence[float]) -> dict[str, float]:
    return {
        "samples": len(delays),
        "p50_ms": percentile(delays, 50),
        "p99_ms": percentile(delays, 99),
        "max_ms": max(delays) if delays else float("nan"),
        "mean_ms": sum(delays) / len(delays) if delays else float("nan"),
    }


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` (psutil where installed, else Linux's /proc)."""
    try:
        import psutil  # noqa: PLC0415 - optional: only Fairlane's environment has it

        return int(psutil.Process(pid).memory_info().rss)
    except ImportError:
        pass
    except Exception:
        return None
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class Adapter:
    """What a driver implements for its system; ``ns`` names the run's queue/namespace.

    ``handle`` values are whatever the system's enqueue returns. Every task body is the
    same on every system: ``noop(n) -> n``, ``pair(n, tag) -> n``, ``stamp() ->
    time.time_ns()`` at its start, ``work(seconds) -> time.time_ns()`` at its start, then
    ``asyncio.sleep(seconds)``.
    """

    #: how the batch enqueue is done ("enqueue_many", "gather", ...), for the report
    batch_method = "gather"
    #: tenants are honoured (the noisy-neighbor scenario puts two tenants on one queue)
    tenants = False
    #: the server commands one ``drained`` call costs (taken out of the server's counts)
    poll_commands: dict[str, int] = {}  # noqa: RUF012 - a constant of each subclass

    def __init__(self, params: Params) -> None:
        self.p = params
        self.url: str = params["url"]
        self.ns: str = params["ns"]

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def cleanup(self) -> None:
        """Delete every key of the run's namespace."""

    async def enqueue_noops(self, start: int, stop: int) -> None:
        raise NotImplementedError

    async def enqueue_pairs(self, start: int, stop: int) -> None:
        """``pair(n, PAIR_TAG)`` for each ``n`` in ``range(start, stop)``, as one batch."""
        raise NotImplementedError

    async def memory_info(self) -> dict[str, Any]:
        """The server's ``INFO memory`` section, field name to value."""
        raise NotImplementedError

    async def drained(self, total: int) -> bool:
        """Every job enqueued has completed and its completion is recorded."""
        raise NotImplementedError

    async def enqueue_stamp(self) -> Any:
        raise NotImplementedError

    async def enqueue_work(self, seconds: float, tenant: str) -> Any:
        raise NotImplementedError

    async def enqueue_work_many(self, seconds: float, count: int, tenant: str) -> list[Any]:
        return list(
            await asyncio.gather(*(self.enqueue_work(seconds, tenant) for _ in range(count)))
        )

    async def started_ns(self, handle: Any, timeout: float, *, fast: bool = False) -> int:
        """The task's return value (its start time); ``fast``: poll quickly if polling."""
        raise NotImplementedError

    async def serve(self, concurrency: int) -> None:
        """Run a worker at ``concurrency`` until cancelled (or the system stops on SIGTERM)."""
        raise NotImplementedError

    def versions(self) -> dict[str, str | None]:
        return {}


# -- the worker process -----------------------------------------------------------------


def _script() -> str:
    """This driver's own file, to start its worker with."""
    return os.path.abspath(sys.modules["__main__"].__file__ or sys.argv[0])


class WorkerProcess:
    """This driver run as ``worker``: another process of the same interpreter."""

    def __init__(self, params: Params, *, bytecode: bool = False) -> None:
        self.params = params
        self.env: dict[str, str] | None = None
        if bytecode:
            self.env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        self.proc: asyncio.subprocess.Process | None = None
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self.rss_peak = 0
        self.rss_last = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self, timeout: float = 60.0) -> float:
        """Start it; returns the epoch time of its ``ready`` line."""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            _script(),
            "worker",
            "-",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self.log,
            env=self.env,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(self.params).encode() + b"\n")
        await self.proc.stdin.drain()
        self.proc.stdin.close()
        async with asyncio.timeout(timeout):
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    await self.proc.wait()
                    raise RuntimeError(
                        f"worker exited ({self.proc.returncode}) before ready:\n{self.tail()}"
                    )
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if event.get("event") == "ready":
                        return float(event["t"])

    def sample_rss(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        rss = rss_bytes(self.proc.pid)
        if rss:
            self.rss_last = rss
            self.rss_peak = max(self.rss_peak, rss)

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``STOP_GRACE`` seconds."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(STOP_GRACE):
                await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()

    def tail(self, lines: int = 30) -> str:
        self.log.seek(0)
        return "\n".join(self.log.read().decode(errors="replace").splitlines()[-lines:])

    async def close(self) -> None:
        await self.stop()
        self.log.close()


async def wait_until(
    check: Callable[[], Awaitable[bool]],
    *,
    timeout: float,
    interval: float = POLL,
    each: Callable[[], None] | None = None,
) -> tuple[float, int]:
    """Poll ``check`` until it is true; returns that moment (epoch seconds) and the polls."""
    deadline = time.monotonic() + timeout
    polls = 0
    while True:
        if each is not None:
            each()
        polls += 1
        if await check():
            return time.time(), polls
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout:.0f}s")
        await asyncio.sleep(interval)


def _worker_params(p: Params, concurrency: int) -> Params:
    return {**p, "concurrency": concurrency}


# -- the scenarios ------------------------------------------------------------------------


async def throughput(a: Adapter, p: Params) -> dict[str, Any]:
    """Enqueue ``jobs`` no-op jobs (batches of ``batch``), then time one worker draining them."""
    jobs, batch, timeout = int(p["jobs"]), int(p["batch"]), float(p["timeout"])
    worker = WorkerProcess(_worker_params(p, int(p["concurrency"])))
    try:
        started = time.perf_counter()
        for start in range(0, jobs, batch):
            await a.enqueue_noops(start, min(jobs, start + batch))
        enqueue_s = time.perf_counter() - started
        ready = await worker.start()
        done, polls = await wait_until(
            lambda: a.drained(jobs), timeout=timeout, each=worker.sample_rss
        )
        worker.sample_rss()
    finally:
        await worker.close()
    drain_s = done - ready
    return {
        "jobs": jobs,
        "concurrency": p["concurrency"],
        "batch": batch,
        "batch_method": a.batch_method,
        "enqueue_seconds": enqueue_s,
        "enqueue_jobs_per_s": jobs / enqueue_s,
        "drain_seconds": drain_s,
        "jobs_per_s": jobs / drain_s,
        "worker_rss_peak_mb": worker.rss_peak / 2**20,
        "worker_rss_end_mb": worker.rss_last / 2**20,
        "polls": polls,
        "poll_commands": {name: n * polls for name, n in a.poll_commands.items()},
    }


async def latency(a: Adapter, p: Params) -> dict[str, Any]:
    """One job at a time to an idle worker: its start time minus the time before enqueue.

    Stops after ``samples`` samples or ``budget`` seconds, whichever comes first (a
    system that polls every half second would otherwise take minutes).
    """
    samples, warmup = int(p["samples"]), int(p["warmup"])
    gap, budget = float(p["gap"]), float(p["budget"])
    worker = WorkerProcess(_worker_params(p, int(p["concurrency"])))
    starts: list[float] = []
    round_trips: list[float] = []
    try:
        await worker.start()
        await asyncio.sleep(float(p["settle"]))  # the worker connects and waits for work
        deadline = time.monotonic() + budget
        for i in range(warmup + samples):
            if i > warmup and time.monotonic() > deadline:
                break
            await asyncio.sleep(gap)  # the worker is back to waiting
            before = time.time_ns()
            handle = await a.enqueue_stamp()
            started = await a.started_ns(handle, 30.0, fast=True)
            after = time.time_ns()
            if i >= warmup:
                starts.append((started - before) / 1e6)
                round_trips.append((after - before) / 1e6)
    finally:
        await worker.close()
    return {
        **delays_ms(starts),
        "round_trip_p50_ms": percentile(round_trips, 50),
        "round_trip_p99_ms": percentile(round_trips, 99),
        "budget_seconds": budget,
    }


async def startup(a: Adapter, p: Params) -> dict[str, Any]:
    """A worker's start-up: spawned with one job waiting, the job's start minus the moment
    before the spawn (the interpreter, the imports, the connection and the first fetch).

    A deployed worker imports from compiled bytecode, as a package installer writes it;
    an environment that sets ``PYTHONDONTWRITEBYTECODE`` would make every spawn compile
    each module again. So the workers here may write bytecode, and the first spawn, which
    writes what is missing, is not counted."""
    delays: list[float] = []
    for sample in range(int(p["startup_samples"]) + 1):
        await a.cleanup()
        handle = await a.enqueue_stamp()
        worker = WorkerProcess(_worker_params(p, int(p["concurrency"])), bytecode=True)
        try:
            spawned = time.time_ns()
            await worker.start()
            started = await a.started_ns(handle, float(p["timeout"]))
        finally:
            await worker.close()
        if sample:
            delays.append((started - spawned) / 1e6)
    return delays_ms(delays)


async def noisy(a: Adapter, p: Params) -> dict[str, Any]:
    """A flood of ``flood`` x ``flood_ms`` jobs, then ``quiet`` x ``quiet_ms`` jobs; the
    quiet ones' start delays. With tenants (Fairlane) the two are different tenants;
    the peers have none, so both go to the one queue, first in first out."""
    flood, quiet = int(p["flood"]), int(p["quiet"])
    flood_s, quiet_s = float(p["flood_ms"]) / 1000, float(p["quiet_ms"]) / 1000
    worker = WorkerProcess(_worker_params(p, int(p["noisy_concurrency"])))
    try:
        await worker.start()
        await asyncio.sleep(float(p["settle"]))
        t0 = time.perf_counter()
        for start in range(0, flood, 500):
            await a.enqueue_work_many(flood_s, min(500, flood - start), "flood")
        flood_enqueue_s = time.perf_counter() - t0
        quiet_jobs = []
        for _ in range(quiet):
            before = time.time_ns()
            quiet_jobs.append((before, await a.enqueue_work(quiet_s, "quiet")))
        delays = []
        for before, handle in quiet_jobs:
            started = await a.started_ns(handle, float(p["timeout"]))
            delays.append((started - before) / 1e6)
        quiet_done_s = time.perf_counter() - t0
    finally:
        await worker.close()
    return {
        **delays_ms(delays),
        "flood": flood,
        "flood_ms": p["flood_ms"],
        "quiet": quiet,
        "quiet_ms": p["quiet_ms"],
        "concurrency": p["noisy_concurrency"],
        "tenants": a.tenants,
        "flood_enqueue_seconds": flood_enqueue_s,
        "quiet_done_after_s": quiet_done_s,
    }


async def _server_memory(a: Adapter) -> dict[str, int]:
    """``used_memory`` and the part of it that is connections' buffers, once the server
    has freed what earlier runs unlinked and finished growing its tables."""
    for _ in range(600):  # 30 s at most
        info = await a.memory_info()
        if not int(info.get("lazyfree_pending_objects", 0)):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(SETTLE)
    info = await a.memory_info()
    return {k: int(info[k]) for k in ("used_memory", "mem_clients_normal")}


async def memory(a: Adapter, p: Params) -> dict[str, Any]:
    """The server memory a waiting job costs: ``memory_jobs`` ``pair`` jobs enqueued in
    batches of ``batch`` with no worker running, ``used_memory`` read before and after."""
    jobs, batch = int(p["memory_jobs"]), int(p["batch"])
    await a.cleanup()
    before = await _server_memory(a)
    started = time.perf_counter()
    for start in range(0, jobs, batch):
        await a.enqueue_pairs(start, min(jobs, start + batch))
    enqueue_s = time.perf_counter() - started
    after = await _server_memory(a)
    used = after["used_memory"] - before["used_memory"]
    clients = after["mem_clients_normal"] - before["mem_clients_normal"]
    return {
        "jobs": jobs,
        "batch": batch,
        "batch_method": a.batch_method,
        "enqueue_seconds": enqueue_s,
        "before": before,
        "after": after,
        # the producer's connections hold buffers whatever is stored: not the jobs' cost
        "bytes_per_job": (used - clients) / jobs,
        "used_memory_per_job": used / jobs,
        "clients_bytes_per_job": clients / jobs,
    }


SCENARIOS: dict[str, Callable[[Adapter, Params], Awaitable[dict[str, Any]]]] = {
    "throughput": throughput,
    "latency": latency,
    "startup": startup,
    "noisy": noisy,
    "memory": memory,
}


# -- entry point --------------------------------------------------------------------------


def run_loop(coro: Awaitable[Any]) -> Any:
    """Run ``coro`` on uvloop where installed (every system gets the same event loop)."""
    try:
        import uvloop  # noqa: PLC0415 - optional

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)  # type: ignore[arg-type]


async def _produce(adapter: Adapter, scenario: str, extra: dict[str, Any]) -> dict[str, Any]:
    run = extra.get(scenario) or SCENARIOS[scenario]
    await adapter.open()
    try:
        figures = await run(adapter, adapter.p)
        if adapter.p.get("handshake"):
            emit("measured")
            await asyncio.to_thread(sys.stdin.readline)
        return figures
    finally:
        try:
            await adapter.cleanup()
        finally:
            await adapter.close()


async def _serve(adapter: Adapter) -> None:
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    assert main_task is not None
    # until the system installs its own handlers, SIGTERM cancels the worker
    loop.add_signal_handler(signal.SIGTERM, main_task.cancel)
    emit("ready")
    with contextlib.suppress(asyncio.CancelledError):
        await adapter.serve(int(adapter.p["concurrency"]))


def dist_versions(*names: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _params(arg: str) -> Params:
    params: Params = json.loads(sys.stdin.readline() if arg == "-" else arg)
    return params


def main(
    make: Callable[[Params], Adapter],
    extra: dict[str, Callable[[Adapter, Params], Awaitable[dict[str, Any]]]] | None = None,
) -> None:
    """``run``, ``worker`` or ``versions``, as the module docstring says."""
    # no system logs per job at WARNING: logging costs nobody anything here
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    argv = sys.argv[1:]
    command = argv[0] if argv else ""
    if command == "versions":
        adapter = make({"url": "", "ns": ""})
        emit("versions", versions=adapter.versions(), python=sys.version.split()[0])
        return
    if command == "worker" and len(argv) == 2:
        run_loop(_serve(make(_params(argv[1]))))
        return
    if command == "run" and len(argv) == 3:
        scenario, params = argv[1], _params(argv[2])
        try:
            figures = run_loop(_produce(make(params), scenario, extra or {}))
        except Exception as exc:
            traceback.print_exc()
            emit("error", message=f"{type(exc).__name__}: {exc}")
            raise SystemExit(1) from None
        emit("result", figures=figures)
        return
    sys.stderr.write(__doc__ or "")
    raise SystemExit(2)
