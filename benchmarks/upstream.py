"""Upstream: tenants calling a rate-limited model endpoint on loopback, four ways.

The upstream is :class:`fairlane.testing.upstream.Upstream` in this process: N calls
per second (``--n``, default 40) and T tokens per minute (``--tpm``, default a minute
of calls at N: present, not binding in a run this short), its buckets of capacity N
and T refilled continuously, each admitted call taking ``--latency`` seconds (default
0.2, so N * latency = 8 calls in flight use it fully), 429 with a ``Retry-After`` in
whole seconds beyond its limits. ``tenants`` equal tenants (4) each enqueue ``N *
seconds / tenants`` jobs, one tenant after the other, of a task that makes one call
with httpx (its tokens: 500 in, 100-700 out; the estimate declares 500 + 700); one
worker process of ``--concurrency`` slots (64) runs them. Four runs of the same
workload, each with a fresh app and worker, the upstream's buckets refilled and
counts cleared in between:

* ``retry``: no rate key; on a 429 the task raises an ordinary exception, retried by
  the task's attempts (30) with exponential backoff (0.5 s doubling, at most 8 s, full
  jitter): every slot calls as soon as it holds a job.
* ``rate``: a static rate key at the upstream's capacity,
  ``rates={"model:up": Rate(N, per=1.0), "model:up:tokens": Rate(T / 1000, per=60.0,
  cost="units")}`` (1 unit per 1000 tokens: the estimate priced as admission prices
  it, corrected by what the call used); on a 429 the task raises
  ``Throttled("model:up", retry_after=<the header>)``. Its burst is N, the upstream's
  own: the two buckets empty together, and a call whose trip to the upstream is
  quicker than the one before it finds the upstream's empty.
* ``rate_half_burst``: the same with ``Rate(N, per=1.0, burst=N / 2)``: the same
  long-run rate, and the upstream's bucket keeps N / 2 calls of room for the trips'
  jitter.
* ``adaptive``: ``limits={"model:up": Adaptive(max=concurrency, min=1)}``, far above
  the 8 calls in flight the upstream serves; ``Throttled`` on a 429 as above.

Figures per run, from the upstream's own counts and the tasks' own stamps: goodput
(calls served over the most the upstream could serve from its first call to its last
admission, its burst included), 429s as a share of calls (all of them, and those of
the first 30 s), tenants' shares of the calls served while every tenant still had
work and their Jain index, and completion time (enqueue to done) p50/p99/max. The
targets (issue 17) are printed as pass/fail lines, not asserted: with a rate key at
most 1 % 429s and at least 95 % goodput; ``Adaptive`` at most 5 % 429s within 30 s of
its start; equal tenants' Jain index at least 0.99. The last target, the no-op
throughput unchanged within 5 % when no rate key is declared, is the ``throughput``
phase's figure, measured against the code before rate keys.

Run: ``python -m benchmarks.upstream [--redis-url URL]`` (default: a private server)
``[--n 40] [--seconds 30] [--latency 0.2] [--tenants 4] [--concurrency 64]``; or
``fairlane bench --phase upstream --no-peers``. A full run takes about two and a half
minutes (30 s of work per way: the Adaptive target is for its first 30 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx

from benchmarks.common import (
    Meter,
    WorkerProcess,
    delete_matching,
    emit,
    percentile,
    wait_until,
)
from fairlane import (
    Adaptive,
    App,
    Backoff,
    Estimate,
    JobCancelled,
    JobExpired,
    Rate,
    Retention,
    Task,
    TaskFailed,
    Throttled,
    context,
)
from fairlane.runtime.loop import run as run_loop
from fairlane.store.keys import AppKeys
from fairlane.store.views.rates import RateKeys, rate_keys
from fairlane.testing import RedisServer
from fairlane.testing.upstream import Upstream

MODULE = "benchmarks.upstream"
CALL = "bench.upstream.call"
KEY = "model:up"
TOKENS_KEY = "model:up:tokens"
WAYS = ("retry", "rate", "rate_half_burst", "adaptive")
INPUT_TOKENS, MAX_OUTPUT_TOKENS, MIN_OUTPUT_TOKENS = 500, 700, 100
ESTIMATE = Estimate(input_tokens=INPUT_TOKENS, max_output_tokens=MAX_OUTPUT_TOKENS)
RETRY_ATTEMPTS = 30
RETRY_BACKOFF = Backoff(base=0.5, cap=8.0, jitter="full")
FIRST_SECONDS = 30.0  # the adaptive target's window
SLICE_SECONDS = 2.5  # 429s are counted per slice of this many seconds from the first call
TITLES = {
    "retry": "no rate key, retries with backoff",
    "rate": "Rate(N, per=1) (burst N, the upstream's)",
    "rate_half_burst": "Rate(N, per=1, burst=N/2)",
    "adaptive": "Adaptive(max=slots), Throttled on 429",
}


class UpstreamBusy(Exception):
    """The upstream answered 429 (the ``retry`` way: an ordinary, retried failure)."""


@dataclass(frozen=True, slots=True)
class Shape:
    """What the producer and the worker both declare the app from."""

    way: str
    upstream_url: str
    n: float
    tpm: float | None
    concurrency: int


def retry_after(header: str | None) -> float | str:
    """The header as ``Throttled`` takes it: seconds, or the HTTP-date as given."""
    if header is None:
        return 1.0
    try:
        return float(header)
    except ValueError:
        return header


class _Clients:
    """The worker's HTTP clients, one per call in flight, made in its loop as needed.

    One client of one connection per running call, not one client for all: httpx's
    connection pool looks at every connection for every request, which on a client
    shared by 64 calls in flight costs more CPU than the calls themselves (and would
    slow the calls, not the upstream, down). ``verify=False``: plain HTTP, and no CA
    bundle loaded for each client."""

    free: ClassVar[list[httpx.AsyncClient]] = []
    made: ClassVar[list[httpx.AsyncClient]] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def one(cls) -> AsyncIterator[httpx.AsyncClient]:
        if cls.free:
            client = cls.free.pop()
        else:
            limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
            client = httpx.AsyncClient(limits=limits, timeout=30.0, verify=False)
            cls.made.append(client)
        try:
            yield client
        finally:
            cls.free.append(client)

    @classmethod
    async def aclose(cls) -> None:
        for client in cls.made:
            await client.aclose()
        cls.free.clear()
        cls.made.clear()


def make_app(name: str, url: str, shape: Shape) -> tuple[App, Task[[int], int]]:
    """The run's app and its task, declared identically by the producer and the worker."""
    app = App(name, redis_url=url, charge="jobs")
    options: dict[str, Any] = {}
    if shape.way == "retry":
        options = {"attempts": RETRY_ATTEMPTS, "backoff": RETRY_BACKOFF}
    elif shape.way in ("rate", "rate_half_burst"):
        burst = shape.n / 2 if shape.way == "rate_half_burst" else None
        rates = {KEY: Rate(shape.n, per=1.0, burst=burst)}
        if shape.tpm is not None:
            rates[TOKENS_KEY] = Rate(shape.tpm / 1000.0, per=60.0, cost="units")
        options = {"rates": rates}
    else:
        options = {"limits": {KEY: Adaptive(max=shape.concurrency, min=1)}}
    endpoint = f"{shape.upstream_url}/v1/complete"

    # every record kept: the figures read each job's end
    @app.task(name=CALL, retention=Retention(completed=None, failed=None), **options)
    async def call(tokens: int) -> int:
        ctx = context()
        async with _Clients.one() as client:
            answer = await client.post(
                endpoint, json={"tokens": tokens}, headers={"X-Tenant": ctx.tenant}
            )
        if answer.status_code == 429:
            after = retry_after(answer.headers.get("Retry-After"))
            if shape.way == "retry":
                raise UpstreamBusy(f"429, Retry-After {after}")
            raise Throttled(KEY, retry_after=after)
        answer.raise_for_status()
        ctx.report_usage(input_tokens=INPUT_TOKENS, output_tokens=tokens - INPUT_TOKENS)
        return time.time_ns()

    return app, call


# -- figures ---------------------------------------------------------------------------------


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one has everything."""
    total, squares = sum(values), sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares > 0 else 1.0


def figures(
    upstream: Upstream,
    way: str,
    tenants: list[str],
    ends: list[tuple[int, int | None]],
    *,
    tokens_per_call: int,
) -> dict[str, Any]:
    """One run's figures: ``ends`` is (enqueue ns, end ns or None when it failed) per job."""
    stats = upstream.stats()
    served = [t for t, _ in stats.served_at]
    calls_at = sorted(served + [t for t, _ in stats.throttled_at])
    first = calls_at[0] if calls_at else 0.0
    span = (served[-1] - first) if served else 0.0
    most = upstream.most_served(span, tokens_per_call)
    # while every tenant still had work: up to the first tenant's last admitted call
    last_of = {t: max((s for s, who in stats.served_at if who == t), default=0.0) for t in tenants}
    window_end = min(last_of.values()) if last_of else 0.0
    in_window = {t: 0 for t in tenants}
    for at, who in stats.served_at:
        if at <= window_end and who in in_window:
            in_window[who] += 1
    total_in_window = sum(in_window.values())
    early = [t for t in calls_at if t - first <= FIRST_SECONDS]
    early_throttled = sum(1 for t, _ in stats.throttled_at if t - first <= FIRST_SECONDS)
    done = [(end - enq) / 1e6 for enq, end in ends if end is not None]
    slices = [0] * (int(span // SLICE_SECONDS) + 1)
    for at, _ in stats.throttled_at:
        slices[min(len(slices) - 1, max(0, int((at - first) // SLICE_SECONDS)))] += 1
    return {
        "way": way,
        "jobs": len(ends),
        "completed": len(done),
        "failed": len(ends) - len(done),
        "calls": stats.calls,
        "served": stats.served,
        "throttled": stats.throttled,
        "throttled_share": stats.throttled / stats.calls if stats.calls else 0.0,
        "throttled_share_first_30s": early_throttled / len(early) if early else 0.0,
        "throttled_per_slice": slices,
        "span_s": span,
        "served_per_s": stats.served / span if span > 0 else 0.0,
        "capacity_per_s": upstream.requests_per_second,
        "goodput": stats.served / most if most > 0 else 0.0,
        "most_in_1s": stats.most_in_window(1.0),
        "tenant_shares": {
            t: (n / total_in_window if total_in_window else 0.0) for t, n in in_window.items()
        },
        "jain": jain([float(n) for n in in_window.values()]),
        "completion_ms": {
            "p50": percentile(done, 50),
            "p99": percentile(done, 99),
            "max": max(done, default=float("nan")),
        },
    }


def _keys_read(read: RateKeys) -> dict[str, Any]:
    """What the store says of the run's keys at its end (the rate keys' read model)."""
    out: dict[str, Any] = {}
    for key in (KEY, TOKENS_KEY):
        view = read.get(key)
        if view is not None:
            out[key] = {
                "adaptive": view.adaptive,
                "pushbacks": view.pushbacks,
                "taken": view.taken,
                "refunded": view.refunded,
                "debt": view.debt,
                "woken": view.woken,
                "mean_wait_ms": view.waited_ms / view.woken if view.woken else None,
            }
    return out


# -- one run ---------------------------------------------------------------------------------


async def _wait_served(upstream: Upstream, jobs: int, deadline: float) -> None:
    """Until every job's call was served, or the deadline (a retried job may run out)."""

    async def served() -> bool:
        return upstream.stats().served >= jobs or time.monotonic() >= deadline

    await wait_until(served, interval=0.2, timeout=deadline - time.monotonic() + 1)


async def _ends(jobs: list[tuple[int, Any]], timeout: float) -> list[tuple[int, int | None]]:
    out: list[tuple[int, int | None]] = []
    for before, job in jobs:
        try:
            out.append((before, int(await job.result(timeout=timeout))))
        except (TaskFailed, JobCancelled, JobExpired, TimeoutError):  # no completion time
            out.append((before, None))
    return out


async def one_run(
    url: str,
    upstream: Upstream,
    way: str,
    *,
    prefix: str = "flup",
    seconds: float = 15.0,
    tenants: int = 4,
    concurrency: int = 64,
    seed: int = 17,
) -> dict[str, Any]:
    """One run of ``way`` (``retry``, ``rate``, ``adaptive``) against ``upstream``."""
    name = f"{prefix}_{os.getpid()}_{way}"
    shape = Shape(way, upstream.url, upstream.requests_per_second, upstream.tokens_per_minute,
                  concurrency)  # fmt: skip
    app, call = make_app(name, url, shape)
    per_tenant = max(1, round(upstream.requests_per_second * seconds / tenants))
    names = [f"tenant-{i}" for i in range(tenants)]
    rng = random.Random(seed)
    worker = WorkerProcess(MODULE, ["worker", "--url", url, "--app", name, *_shape_args(shape)])
    upstream.reset()
    try:
        await worker.start()
        async with app:
            await asyncio.sleep(1.0)  # the worker connects and blocks waiting
            upstream.reset()  # nothing called it yet; the buckets full from here
            jobs: list[tuple[int, Any]] = []
            for tenant in names:  # one after the other: FIFO would serve them in turn
                calls = [
                    (INPUT_TOKENS + rng.randint(MIN_OUTPUT_TOKENS, MAX_OUTPUT_TOKENS),)
                    for _ in range(per_tenant)
                ]
                before = time.time_ns()
                handles = await call.enqueue_many(calls, tenant=tenant, estimate=ESTIMATE)
                jobs += [(before, h) for h in handles]
            deadline = time.monotonic() + 4 * seconds + 30
            await _wait_served(upstream, len(jobs), deadline)
            ends = await _ends(jobs, max(1.0, deadline - time.monotonic()))
            keys = _keys_read(await app.store.view(rate_keys, 500, 5))
        await worker.stop(timeout=60)
    finally:
        await worker.close()
        meter = Meter(url)
        with meter.own():
            await delete_matching(meter.client, f"{AppKeys.for_app(name).prefix}*")
        await meter.aclose()
    mean_tokens = INPUT_TOKENS + (MIN_OUTPUT_TOKENS + MAX_OUTPUT_TOKENS) // 2
    result = figures(upstream, way, names, ends, tokens_per_call=mean_tokens)
    result.update(seconds=seconds, tenants=tenants, concurrency=concurrency, keys=keys)
    return result


async def run_all(
    url: str,
    prefix: str = "flup",
    *,
    n: float = 40.0,
    tpm: float | None = None,
    latency: float = 0.2,
    **options: Any,
) -> dict[str, Any]:
    """The runs against one upstream, and the targets' figures."""
    tokens = INPUT_TOKENS + MAX_OUTPUT_TOKENS
    tpm = tpm if tpm is not None else 60.0 * n * tokens  # a minute of calls: not binding
    with Upstream(n, tokens_per_minute=tpm, latency=latency) as upstream:
        runs = {way: await one_run(url, upstream, way, prefix=prefix, **options) for way in WAYS}
    ratios: dict[str, float] = {}
    for way in WAYS:
        ratios[f"{way}_goodput"] = runs[way]["goodput"]
        ratios[f"{way}_throttled_share"] = runs[way]["throttled_share"]
        ratios[f"{way}_jain"] = runs[way]["jain"]
    ratios["adaptive_throttled_share_first_30s"] = runs["adaptive"]["throttled_share_first_30s"]
    return {
        **runs,
        "upstream": {"n_per_s": n, "tokens_per_minute": tpm, "latency_s": latency},
        "ratios": ratios,
    }


def verdicts(result: dict[str, Any]) -> list[str]:
    """The targets as pass/fail lines: those of a rate key for each of the two rates."""
    lines: list[tuple[bool, str]] = []
    for way in ("rate", "rate_half_burst"):
        r, name = result[way], TITLES[way]
        lines += [
            (r["throttled_share"] <= 0.01,
             f"{name}: 429s {100 * r['throttled_share']:.2f} % of calls (target <= 1 %)"),
            (r["goodput"] >= 0.95,
             f"{name}: goodput {100 * r['goodput']:.1f} % of capacity (target >= 95 %)"),
        ]  # fmt: skip
    adaptive = result["adaptive"]
    first = adaptive["throttled_share_first_30s"]
    lines.append(
        (first <= 0.05, f"{TITLES['adaptive']}: 429s {100 * first:.2f} % of calls within 30 s "
                        "of start (target <= 5 %)")
    )  # fmt: skip
    for way in ("rate", "rate_half_burst", "adaptive"):
        jain_index = result[way]["jain"]
        lines.append(
            (jain_index >= 0.99,
             f"{TITLES[way]}: equal tenants' Jain index {jain_index:.4f} (target >= 0.99)")
        )  # fmt: skip
    return [f"{'PASS' if ok else 'FAIL'}: {text}" for ok, text in lines]


# -- the worker process ----------------------------------------------------------------------


def _shape_args(shape: Shape) -> list[str]:
    args = ["--way", shape.way, "--upstream", shape.upstream_url, "--n", str(shape.n)]
    args += ["--concurrency", str(shape.concurrency)]
    return args + (["--tpm", str(shape.tpm)] if shape.tpm is not None else [])


async def _serve(args: argparse.Namespace) -> None:
    shape = Shape(args.way, args.upstream, args.n, args.tpm, args.concurrency)
    app, _ = make_app(args.app, args.url, shape)
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    # until the worker installs its own handlers (graceful stop), SIGTERM cancels the start
    loop.add_signal_handler(signal.SIGTERM, main.cancel)
    emit("ready")
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await app.run_worker(concurrency=args.concurrency, handle_signals=True)
    finally:
        await _Clients.aclose()


def _worker(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog=f"{MODULE} worker")
    parser.add_argument("--url", required=True)
    parser.add_argument("--app", required=True)
    parser.add_argument("--way", choices=WAYS, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--n", type=float, required=True)
    parser.add_argument("--tpm", type=float, default=None)
    parser.add_argument("--concurrency", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    run_loop(_serve(args))
    emit("exit", commands={})


# -- the command -----------------------------------------------------------------------------


async def _main(url: str | None, **options: Any) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        if url is None:
            url = stack.enter_context(RedisServer()).url
        return await run_all(url, **options)


def _print(result: dict[str, Any]) -> None:
    for way in WAYS:
        r = result[way]
        c = r["completion_ms"]
        print(
            f"{TITLES[way]}: goodput {100 * r['goodput']:.1f} % of capacity "
            f"({r['served_per_s']:.1f}/s of {r['capacity_per_s']:g}/s over {r['span_s']:.1f} s), "
            f"429s {100 * r['throttled_share']:.2f} % of {r['calls']} calls "
            f"({100 * r['throttled_share_first_30s']:.2f} % in the first 30 s), "
            f"Jain {r['jain']:.4f}, completion p50 {c['p50'] / 1000:.2f} s "
            f"p99 {c['p99'] / 1000:.2f} s max {c['max'] / 1000:.2f} s, "
            f"{r['completed']}/{r['jobs']} completed"
        )
    for line in verdicts(result):
        print(line)
    print("(the no-op throughput target is the throughput phase's figure)")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        _worker(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", default=None, help="default: a private server")
    parser.add_argument("--n", type=float, default=40.0, help="the upstream's calls per second")
    parser.add_argument("--tpm", type=float, default=None, help="its tokens per minute")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per served call")
    parser.add_argument("--seconds", type=float, default=30.0, help="work per run at capacity")
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64, help="the worker's slots")
    args = parser.parse_args(argv)
    result = run_loop(
        _main(
            args.redis_url, n=args.n, tpm=args.tpm, latency=args.latency, seconds=args.seconds,
            tenants=args.tenants, concurrency=args.concurrency,
        )
    )  # fmt: skip
    _print(result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
