"""Server instructions per job, counted by callgrind: a figure that does not move with
the machine's neighbours, as timings on a shared machine do.

A private ``redis-server`` runs under ``valgrind --tool=callgrind --instr-atstart=no``;
``callgrind_control -i on`` starts counting once the library is loaded (a warm-up app
enqueues and drains one job), and ``-z`` / ``-d`` around each phase count that phase's
instructions alone. Phases: ``jobs`` no-op jobs enqueued with ``enqueue_many`` in batches
of ``batch`` (with ``--tenants T``: one call of ``jobs / T`` jobs per tenant instead),
then drained by one in-process burst worker at ``concurrency``, the app in cost mode.

With ``--split`` the drain is made by hand instead, in two phases counted apart: exchanges
that only fetch (batches of 100, nothing settled) until every job is leased, then
exchanges that only settle them (100 completions each, nothing fetched). Their figures
say how a drain's instructions divide between dispatch and acks; the store's
``exchange`` is the one non-public call it makes.

It needs only Fairlane's public API, so the same module measures another checkout: put
that checkout's ``src`` first on ``PYTHONPATH``. ``--keep DIR`` keeps the dumps
(``cg.out.1`` enqueue, ``cg.out.2`` drain) for ``callgrind_annotate``.

With ``--keyed N`` every job also names ``benchmarks.keyed``'s throttle and rate key and
a fairness key, one of ``N`` (a batch per key in turn), as that benchmark's keyed lane.

With ``--idle N`` it counts the idle path instead: ``N`` enqueues of one job, each
handed to one of ``N`` workers registered idle, then each worker's exchange that settles
that job, finds nothing and registers idle again (per call).

Run: ``python -m benchmarks.instructions [--jobs 20000] [--tenants 10000] [--split]
[--keyed 100] [--idle 50] [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import redis.asyncio as aioredis

from benchmarks.keyed import LIMITS as KEYED_LIMITS
from benchmarks.keyed import RATES as KEYED_RATES
from fairlane import App, Task
from fairlane.runtime.loop import run as run_loop
from fairlane.store.wire import FetchedJob, Outcome

NOOP = "bench.noop"

T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Callgrind:
    """A ``redis-server`` under callgrind, counting only between ``-z`` and ``-d``."""

    def __init__(self, server: str, out: Path) -> None:
        self.port = _free_port()
        self.out = out
        self.proc = subprocess.Popen(
            [
                "valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={out / 'cg.out'}",
                server, "--port", str(self.port), "--save", "", "--appendonly", "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.url = f"redis://127.0.0.1:{self.port}/0"

    async def ready(self, timeout: float = 120.0) -> None:
        client = aioredis.Redis.from_url(self.url)
        deadline = time.monotonic() + timeout
        try:
            while True:
                with contextlib.suppress(OSError, aioredis.ConnectionError):
                    if await client.ping():
                        return
                if time.monotonic() > deadline:
                    raise TimeoutError("redis-server under callgrind did not start")
                await asyncio.sleep(0.5)
        finally:
            await client.aclose()

    def control(self, *flags: str) -> None:
        subprocess.run(
            ["callgrind_control", *flags, str(self.proc.pid)],
            check=True,
            capture_output=True,
        )

    def dump(self) -> int:
        """Dump the counts since the last ``-z``: the instructions executed."""
        before = set(self.out.glob("cg.out.*"))
        self.control("-d")
        deadline = time.monotonic() + 60
        while not (new := set(self.out.glob("cg.out.*")) - before):
            if time.monotonic() > deadline:
                raise TimeoutError("callgrind wrote no dump")
            time.sleep(0.2)
        (path,) = new
        time.sleep(0.5)  # the dump is written in one go, but not atomically
        for line in path.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
        raise ValueError(f"no totals in {path.name}")

    async def phase(self) -> int:
        """The instructions since the last call (or ``-z``), the count then set to nought."""
        done = self.dump()
        self.control("-z")
        return done

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _app(name: str, url: str) -> tuple[App, Task[[int], int]]:
    app = App(name, redis_url=url, charge="cost")

    @app.task(name=NOOP)
    async def noop(n: int) -> int:
        return n

    return app, noop


def batches(jobs: int, batch: int, tenants: int) -> Iterator[tuple[str, list[tuple[int]]]]:
    """(tenant, calls) per ``enqueue_many``."""
    if tenants:
        per = max(1, jobs // tenants)
        for t in range(tenants):
            yield f"t{t}", [(i,) for i in range(per)]
    else:
        for start in range(0, jobs, batch):
            yield "default", [(i,) for i in range(start, min(jobs, start + batch))]


SPLIT_BATCH = 100


async def split_drain(
    app: App, total: int, start: Callable[[], object], mark: Callable[[], Awaitable[T]]
) -> tuple[T, T]:
    """Fetch every job (nothing settled), then settle them all: ``start`` before, ``mark``
    after each phase, giving what that phase did."""
    store, lease_ms = app.store, 600_000
    start()
    leased: list[FetchedJob] = []
    while len(leased) < total:
        fetched = await store.exchange("split", ["default"], SPLIT_BATCH, lease_ms, slots=total)
        if not fetched.jobs:
            raise RuntimeError(f"only {len(leased)} of {total} jobs were fetched")
        leased.extend(fetched.jobs)
    dispatch = await mark()
    for i in range(0, len(leased), SPLIT_BATCH):
        done = [Outcome(j.id, j.token, "ok", "1", cost=0.001) for j in leased[i : i + SPLIT_BATCH]]
        settled = await store.exchange("split", ["default"], 0, lease_ms, done, slots=total)
        if set(settled.ack_codes) != {1}:
            raise RuntimeError(f"acks not applied: {settled.ack_codes}")
    return dispatch, await mark()


async def idle_path(app: App, noop: Task[[int], int], grind: Callgrind, n: int) -> tuple[int, int]:
    """Instructions of the idle path, ``n`` calls each: an enqueue of one job handed to
    an idle worker (``n`` workers of one slot wait, so that each enqueue finds one), then
    each worker's exchange that settles its job, finds nothing and registers idle again."""
    store, lease_ms, lanes = app.store, 600_000, ["default"]
    workers = [f"idle-{k}" for k in range(n)]
    for worker in workers:
        await store.exchange(worker, lanes, 1, lease_ms, idle_ms=600_000, slots=1)
    grind.control("-z")
    for k in range(n):
        await noop.enqueue(k)
    handed = grind.dump()
    leased = []
    for worker in workers:
        got = await store.exchange(worker, lanes, 1, lease_ms, slots=1)
        if len(got.jobs) != 1:
            raise RuntimeError(f"{worker} was handed {len(got.jobs)} jobs, not one")
        leased.append(got.jobs[0])
    grind.control("-z")
    for worker, job in zip(workers, leased, strict=True):
        done = [Outcome(job.id, job.token, "ok", "1", cost=0.001)]
        await store.exchange(worker, lanes, 1, lease_ms, done, idle_ms=600_000, slots=1)
    return handed, grind.dump()


async def measure(  # noqa: PLR0917 - the run's own settings
    server: str,
    jobs: int,
    batch: int,
    tenants: int,
    concurrency: int,
    keep: Path | None,
    split: bool = False,
    keyed: int = 0,
    idle: int = 0,
) -> None:
    out = keep or Path(tempfile.mkdtemp(prefix="fairlane-callgrind-"))
    grind = Callgrind(server, out)
    try:
        await grind.ready()
        warm, warm_noop = _app("flwarm", grind.url)
        async with warm:
            await warm_noop.enqueue(0)
            await warm.run_worker(concurrency=concurrency, burst=True)
        grind.control("-i", "on")
        app, noop = _app("flinstr", grind.url)
        async with app:
            if idle:
                handed, settled = await idle_path(app, noop, grind, idle)
                print(f"idle path, {idle} calls each: server instructions per call")
                print(f"  enqueue handed to an idle worker   {handed / idle:>12,.0f}")
                print(f"  settle one, nothing left, idle     {settled / idle:>12,.0f}")
                return
            grind.control("-z")
            total = 0
            if keyed:
                batch = max(1, min(batch, -(-jobs // keyed)))
            for n, (tenant, calls) in enumerate(batches(jobs, batch, tenants)):
                if keyed:
                    await noop.enqueue_many(
                        calls,
                        tenant=tenant,
                        limits=KEYED_LIMITS,
                        rates=KEYED_RATES,
                        fairness_key=f"user-{n % keyed}",
                    )
                else:
                    await noop.enqueue_many(calls, tenant=tenant)
                total += len(calls)
            enqueue = grind.dump()
            if split:
                dispatch, acks = await split_drain(
                    app, total, lambda: grind.control("-z"), grind.phase
                )
            else:
                grind.control("-z")
                await app.run_worker(concurrency=concurrency, burst=True)
                drain = grind.dump()
        shape = f"{tenants} tenants" if tenants else "one tenant"
        if keyed:
            shape += f", keyed ({keyed} fairness keys)"
        print(f"{total} jobs, {shape}: server instructions per job")
        print(f"  enqueue {enqueue / total:>12,.0f}")
        if split:
            print(f"  fetch   {dispatch / total:>12,.0f}")
            print(f"  settle  {acks / total:>12,.0f}")
        else:
            print(f"  drain   {drain / total:>12,.0f}")
    finally:
        grind.stop()
        if keep is None:
            shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--tenants", type=int, default=0, help="0: one tenant")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--server", default="redis-server")
    parser.add_argument(
        "--split", action="store_true", help="count fetching and settling apart (see above)"
    )
    parser.add_argument(
        "--keyed",
        type=int,
        default=0,
        metavar="N",
        help="every job names the keyed benchmark's throttle and rate key and one of N "
        "fairness keys (0: none)",
    )
    parser.add_argument(
        "--idle",
        type=int,
        default=0,
        metavar="N",
        help="count the idle path instead: N enqueues each handed to an idle worker, then "
        "N exchanges that settle one job and register idle (0: not)",
    )
    parser.add_argument(
        "--keep", type=Path, help="a directory to keep the dumps in, for callgrind_annotate"
    )
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    run_loop(
        measure(
            args.server,
            args.jobs,
            args.batch,
            args.tenants,
            args.concurrency,
            args.keep,
            args.split,
            args.keyed,
            args.idle,
        )
    )


if __name__ == "__main__":
    main()
