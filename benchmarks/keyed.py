"""A keyed lane against the plain one: throttle, rate and fairness keys on every job.

The throughput shape twice in one run: ``jobs`` no-op jobs enqueued with
``enqueue_many``, then one worker process of ``benchmarks.fairlane_worker`` at
``concurrency`` draining them. ``plain``: the jobs as the throughput scenario sends
them. ``keyed``: every job also names a throttle key whose limit never binds
(``limits={"upstream": 1000}``, ten times the worker's slots), a rate key whose tokens
never run out (``rates={"api": Rate(1_000_000, per=1)}``) and a fairness key of its
tenant (one of ``fairness_keys``, a batch per key in turn), so the figure is what the
keys' bookkeeping costs, not any waiting they cause. Both ways use the same batches
(``batch``, at most ``jobs / fairness_keys`` jobs each), the order of the two ways is
the caller's.

Per way: the drain's jobs/s (the worker's ``ready`` to the last completion, as the
throughput scenario times it), the enqueue's jobs/s, and from ``INFO commandstats``,
reset before each phase, each command's calls and server microseconds per job, FCALL
(the functions, the commands they run included) among them. ``ratio``: keyed jobs/s
over plain jobs/s (the issue's target: at least 0.7); ``fcall_ratio``: keyed FCALL
us/job over plain. One keyed job's record is read before the drain to show that it
carries the three keys (``keys_stored``).

Run: ``python -m benchmarks.keyed [--redis-url URL] [--jobs 20000] [--reps 3]``
(default: a private server); repetitions alternate which way goes first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from typing import Any

import redis.asyncio as aioredis

from benchmarks.common import WorkerProcess, delete_matching, wait_until
from benchmarks.fairlane_worker import make_app
from fairlane import Rate
from fairlane.runtime.loop import run as run_loop
from fairlane.store.keys import AppKeys
from fairlane.testing import RedisServer

WORKER = "benchmarks.fairlane_worker"
WAYS = ("plain", "keyed")
#: the throttle limit and the rate: far above what one worker can use
LIMITS = {"upstream": 1000}
RATES = {"api": Rate(1_000_000, per=1)}
#: commands only the benchmark's own connection sends while it measures
_OWN = frozenset({"info", "config|resetstat"})


async def _commandstats(
    meter: aioredis.Redis, jobs: int, polls: int = 0
) -> dict[str, dict[str, float]]:
    """Each command's calls and server microseconds per job since the last reset, less
    the ``polls`` HGETs of the benchmark's own progress checks (their few microseconds
    stay in HGET's time)."""
    raw = await meter.info("commandstats")
    out: dict[str, dict[str, float]] = {}
    for key, value in raw.items():
        name = key.removeprefix("cmdstat_")
        calls = int(value["calls"]) - (polls if name == "hget" else 0)
        if name not in _OWN and calls > 0:
            out[name] = {"calls_per_job": calls / jobs, "usec_per_job": int(value["usec"]) / jobs}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["usec_per_job"]))


def _phase(stats: dict[str, dict[str, float]], seconds: float, jobs: int) -> dict[str, Any]:
    fcall = stats.get("fcall", {"calls_per_job": 0.0, "usec_per_job": 0.0})
    return {
        "seconds": seconds,
        "jobs_per_s": jobs / seconds,
        "fcall_usec_per_job": fcall["usec_per_job"],
        "fcall_calls_per_job": fcall["calls_per_job"],
        # inside the functions and sent directly alike (INFO does not tell them apart)
        "commands_per_job": sum(
            s["calls_per_job"] for name, s in stats.items() if name not in ("fcall", "fcall_ro")
        ),
        "by_command": stats,
    }


async def one_way(
    url: str,
    ns: str,
    way: str,
    *,
    jobs: int = 20_000,
    batch: int = 1_000,
    concurrency: int = 100,
    fairness_keys: int = 100,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Enqueue and drain ``jobs`` no-op jobs one way (``plain`` or ``keyed``)."""
    if way not in WAYS:
        raise ValueError(f"way must be one of {WAYS}, got {way!r}")
    name = f"{ns}_{way}"
    bench = make_app(name, url)
    keys = AppKeys.for_app(name)
    meter = aioredis.Redis.from_url(url)
    size = max(1, min(batch, -(-jobs // fairness_keys)))
    keyed = way == "keyed"
    try:
        async with bench.app:
            await meter.config_resetstat()
            started = time.perf_counter()
            for n, start in enumerate(range(0, jobs, size)):
                calls = [(i,) for i in range(start, min(jobs, start + size))]
                if keyed:
                    await bench.noop.enqueue_many(
                        calls, limits=LIMITS, rates=RATES, fairness_key=f"user-{n % fairness_keys}"
                    )
                else:
                    await bench.noop.enqueue_many(calls)
            enqueue_s = time.perf_counter() - started
            enqueue = _phase(await _commandstats(meter, jobs), enqueue_s, jobs)
            stored = await _stored_keys(meter, keys)
        worker = WorkerProcess(
            WORKER, ["--url", url, "--app", name, "--concurrency", str(concurrency)]
        )
        try:
            await meter.config_resetstat()
            ready = await worker.start()
            polls = 0

            async def drained() -> bool:
                nonlocal polls
                polls += 1
                done = await meter.hget(keys.stats, "completed")
                return int(done or 0) >= jobs

            done = await wait_until(drained, timeout=timeout)
            drain = _phase(await _commandstats(meter, jobs, polls), done - ready, jobs)
            await worker.stop()
        finally:
            await worker.close()
    finally:
        with contextlib.suppress(Exception):
            await delete_matching(meter, f"{keys.prefix}*")
        await meter.aclose()
    return {
        "way": way,
        "jobs": jobs,
        "batch": size,
        "concurrency": concurrency,
        "fairness_keys": fairness_keys if keyed else 0,
        "keys_stored": stored,
        "jobs_per_s": drain["jobs_per_s"],
        "fcall_usec_per_job": drain["fcall_usec_per_job"],
        "drain": drain,
        "enqueue": enqueue,
    }


async def _stored_keys(meter: aioredis.Redis, keys: AppKeys) -> dict[str, bool]:
    """Which keys one stored job's record names: throttle (lim), rate (rk), fairness (fk)."""
    async for key in meter.scan_iter(match=_escaped(keys.job("")) + "*", count=1000):
        record = await meter.hgetall(key)
        return {field: field.encode() in record for field in ("lim", "rk", "fk")}
    return {}


def _escaped(pattern: str) -> str:
    return pattern.replace("{", "\\{").replace("}", "\\}")


async def run(
    url: str,
    ns: str,
    *,
    jobs: int = 20_000,
    batch: int = 1_000,
    concurrency: int = 100,
    fairness_keys: int = 100,
    first: str = "plain",
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Both ways, ``first`` first, and their ratios."""
    order = (first, *(w for w in WAYS if w != first))
    out: dict[str, Any] = {"order": list(order)}
    for way in order:
        out[way] = await one_way(
            url, ns, way, jobs=jobs, batch=batch, concurrency=concurrency,
            fairness_keys=fairness_keys, timeout=timeout,
        )  # fmt: skip
    plain, keyed = out["plain"], out["keyed"]
    out["ratio"] = keyed["jobs_per_s"] / plain["jobs_per_s"]
    out["fcall_ratio"] = keyed["fcall_usec_per_job"] / plain["fcall_usec_per_job"]
    out["jobs"] = jobs
    return out


def summary_lines(result: dict[str, Any]) -> list[str]:
    lines = []
    for way in WAYS:
        r = result[way]
        top = ", ".join(
            f"{name} {s['calls_per_job']:.2f}x {s['usec_per_job']:.1f}us"
            for name, s in list(r["drain"]["by_command"].items())[:8]
        )
        lines.append(
            f"{way:>5}: {r['jobs_per_s']:>8,.0f} jobs/s, FCALL {r['fcall_usec_per_job']:.1f} "
            f"us/job; enqueue {r['enqueue']['jobs_per_s']:,.0f} jobs/s; drain per job: {top}"
        )
    verdict = "pass" if result["ratio"] >= 0.7 else "FAIL"
    lines.append(
        f"keyed / plain: {result['ratio']:.2f}x jobs/s (target >= 0.7: {verdict}), "
        f"{result['fcall_ratio']:.2f}x FCALL us/job"
    )
    return lines


async def _main(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    with contextlib.ExitStack() as stack:
        url = args.redis_url or stack.enter_context(RedisServer()).url
        for rep in range(args.reps):
            result = await run(
                url, "flkeyed", jobs=args.jobs, batch=args.batch, concurrency=args.concurrency,
                fairness_keys=args.fairness_keys, first=WAYS[rep % 2],
            )  # fmt: skip
            results.append(result)
            print(f"rep {rep + 1} ({' then '.join(result['order'])}):", flush=True)
            for line in summary_lines(result):
                print("  " + line, flush=True)
    if len(results) > 1:
        print(
            "medians: "
            + ", ".join(
                f"{way} {statistics.median(r[way]['jobs_per_s'] for r in results):,.0f} jobs/s"
                for way in WAYS
            )
            + f", ratio {statistics.median(r['ratio'] for r in results):.2f}x",
            flush=True,
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None, help="default: a private server")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--fairness-keys", type=int, default=100)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print every figure as JSON too")
    args = parser.parse_args()
    results = run_loop(_main(args))
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
