"""Fairlane's driver: the same protocol and scenarios as the peers' (see ``_driver.py``).

Run with the Python of Fairlane's own environment (the repository's ``.venv``); it
imports ``fairlane`` and, from this checkout, ``benchmarks``. The batch enqueue is
``Task.enqueue_many`` (one server call per batch); the worker is ``App.run_worker`` at
the given concurrency in a process of its own, as for every system. "Drained" is the
app's ``completed`` counter reaching the number of jobs. In the noisy-neighbor scenario
the flood and the quiet jobs are two tenants (charged by learned cost, the default).

Scenarios only Fairlane has: ``tenants`` (throughput against the number of active
tenants, ``benchmarks/tenants.py``), ``submit`` (admission decisions from concurrent
submitter processes, ``benchmarks/submit.py``), ``overload`` (a 16-slot lane offered
more than it serves, with and without admission, ``benchmarks/overload.py``),
``shared_key`` (quiet tenants behind a flood on one throttle key, fair waiters against
FIFO waiters and the lane without the key, ``benchmarks/shared_key.py``), and
``upstream`` (tenants calling a rate-limited model endpoint on loopback: retries, a
rate key at its capacity, an adaptive limit, ``benchmarks/upstream.py``).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's benchmarks

from _driver import PAIR_TAG, Adapter, Params, dist_versions, main
from benchmarks.fairlane_worker import make_app

from fairlane.store.api import unlink_matching
from fairlane.store.keys import AppKeys


class Fairlane(Adapter):
    batch_method = "enqueue_many"
    poll_commands = {"hget": 1}  # noqa: RUF012
    tenants = True

    async def open(self) -> None:
        self.bench = make_app(self.ns, self.url)
        await self.bench.app.connect()
        self.keys = AppKeys.for_app(self.ns)

    async def close(self) -> None:
        await self.bench.app.aclose()

    async def cleanup(self) -> None:
        await unlink_matching(self.bench.app.store.client, f"{self.keys.prefix}*")

    async def enqueue_noops(self, start: int, stop: int) -> None:
        await self.bench.noop.enqueue_many([(i,) for i in range(start, stop)])

    async def enqueue_pairs(self, start: int, stop: int) -> None:
        await self.bench.pair.enqueue_many([(i, PAIR_TAG) for i in range(start, stop)])

    async def memory_info(self) -> dict[str, Any]:
        return dict(await self.bench.app.store.client.info("memory"))

    async def drained(self, total: int) -> bool:
        raw = await self.bench.app.store.client.hget(self.keys.stats, "completed")
        return int(raw or 0) >= total

    async def enqueue_stamp(self) -> Any:
        return await self.bench.stamp.enqueue()

    async def enqueue_work(self, seconds: float, tenant: str) -> Any:
        return await self.bench.work.enqueue(seconds, tenant=tenant)

    async def enqueue_work_many(self, seconds: float, count: int, tenant: str) -> list[Any]:
        return await self.bench.work.enqueue_many([(seconds,)] * count, tenant=tenant)

    async def started_ns(self, handle: Any, timeout: float, *, fast: bool = False) -> int:
        return int(await handle.result(timeout=timeout))  # waits on the completion channel

    async def serve(self, concurrency: int) -> None:
        await make_app(self.ns, self.url).app.run_worker(
            concurrency=concurrency, handle_signals=True
        )

    def versions(self) -> dict[str, str | None]:
        return dist_versions("fairlane", "redis", "hiredis", "uvloop")


async def tenants(a: Adapter, p: Params) -> dict[str, Any]:
    """Jobs/s of one worker against the number of tenants the jobs are spread over."""
    from benchmarks.tenants import drain_rate  # noqa: PLC0415 - not on the worker's path

    out: dict[str, Any] = {}
    for count in p["tenant_counts"]:
        out[str(count)] = await drain_rate(
            a.url, int(count), int(p["tenant_jobs"]), int(p["concurrency"])
        )
    base = out[str(p["tenant_counts"][0])]["jobs_per_s"]
    for run in out.values():
        run["ratio_to_first"] = run["jobs_per_s"] / base
    return {"by_tenants": out}


async def backlog(a: Adapter, p: Params) -> dict[str, Any]:
    """Jobs/s of one worker against the backlog it drains, over the same tenants: does a
    job cost more when more wait behind it?"""
    from benchmarks.tenants import drain_rate  # noqa: PLC0415 - not on the worker's path

    out: dict[str, Any] = {}
    for size in p["backlog_sizes"]:
        out[str(size)] = await drain_rate(
            a.url, int(p["backlog_tenants"]), int(size), int(p["concurrency"])
        )
    base = out[str(p["backlog_sizes"][0])]["jobs_per_s"]
    for run in out.values():
        run["ratio_to_first"] = run["jobs_per_s"] / base
    return {"by_size": out}


async def submit(a: Adapter, p: Params) -> dict[str, Any]:
    """``task.submit`` decisions/s and latency from concurrent submitter processes."""
    from benchmarks.submit import bench_submit  # noqa: PLC0415 - not on the worker's path

    return await asyncio.to_thread(
        bench_submit, a.url, int(p["submit_processes"]), float(p["submit_seconds"]), 10_000_000
    )


async def overload(a: Adapter, p: Params) -> dict[str, Any]:
    """The seed's token-pool experiment, with and without admission (``overload.py``)."""
    from benchmarks import overload as overload_bench  # noqa: PLC0415 - as above

    return await overload_bench.run_all(
        a.url, a.ns, slots=int(p["overload_slots"]), seconds=float(p["overload_seconds"])
    )


async def shared_key(a: Adapter, p: Params) -> dict[str, Any]:
    """Quiet tenants behind a flood on a shared key of limit L (``shared_key.py``)."""
    from benchmarks import shared_key as shared_key_bench  # noqa: PLC0415 - as above

    return await shared_key_bench.run_all(
        a.url, a.ns, limit=int(p["shared_limit"]), flood=int(p["shared_flood"]),
        quiet=int(p["shared_quiet"]), job_ms=float(p["shared_job_ms"]),
        gap_ms=float(p["shared_gap_ms"]),
    )  # fmt: skip


async def upstream(a: Adapter, p: Params) -> dict[str, Any]:
    """Tenants calling a rate-limited upstream on loopback, four ways (``upstream.py``)."""
    from benchmarks import upstream as upstream_bench  # noqa: PLC0415 - as above

    return await upstream_bench.run_all(
        a.url, a.ns, n=float(p["upstream_n"]), latency=float(p["upstream_latency"]),
        seconds=float(p["upstream_seconds"]), tenants=int(p["upstream_tenants"]),
        concurrency=int(p["upstream_concurrency"]),
    )  # fmt: skip


class _Plain(Fairlane):
    """For the Fairlane-only scenarios: nothing to open, they make their own apps."""

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def cleanup(self) -> None:
        pass


def _make(params: Params) -> Adapter:
    scenario = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "run" else ""
    return _Plain(params) if scenario in EXTRA else Fairlane(params)


EXTRA = {
    "tenants": tenants,
    "backlog": backlog,
    "submit": submit,
    "overload": overload,
    "shared_key": shared_key,
    "upstream": upstream,
}

if __name__ == "__main__":
    main(_make, EXTRA)
