"""How good are start-time estimates? Predicted against real starts, on a private server.

``python -m benchmarks.startpredict`` runs one in-process worker of 16 slots on the
default lane and three tenants of different weights and job lengths:

====== ====== ================ ==================
tenant weight job length       submits
====== ====== ================ ==================
``a``  1      0.2 s +-25 %     ``--rate-a`` per s
``b``  2      0.1 s +-25 %     ``--rate-b`` per s
``c``  1      0.4 s +-25 %     ``--rate-c`` per s
====== ====== ================ ==================

Each tenant submits at a steady rate (exponential gaps) for ``--seconds``; every
submission asks for its estimate (``estimate_start=True``), and each job notes when it
really started (the same machine's clock). The first ``--warmup`` seconds are left
out: the worker's learned lengths settle in them (it sends them every 2 s).

The relative error of a job is ``|predicted wait - real wait| / real wait``, both from
its submission. Printed: the median and p90 over every measured job, over those that
waited at least one job length of their tenant (where a relative error means
something), per tenant, and the mean signed error (negative: the estimates were early).
The default rates overload the lane (every tenant keeps a queue); ``--light`` gives
``c`` a rate below its share, the case the error model names first (a tenant that
keeps no queue takes its share as it submits, which the estimate cannot see).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import statistics
import sys
import time
from typing import Any

from fairlane import App
from fairlane.app.worker import Worker
from fairlane.config.settings import load_settings
from fairlane.testing import RedisServer

__all__ = ["main"]

SLOTS = 16
TENANTS = {"a": (1.0, 0.2), "b": (2.0, 0.1), "c": (1.0, 0.4)}  # weight, job length


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _run(url: str, rates: dict[str, float], seconds: float, warmup: float) -> dict[str, Any]:
    settings = load_settings(worker={"concurrency": SLOTS, "idle_block": 0.2})
    app = App(f"sp_{secrets.token_hex(3)}", redis_url=url, settings=settings)
    started: dict[int, float] = {}
    rng = random.Random(17)

    submitted = [10**9]  # jobs submitted, once the producers are done
    all_started = asyncio.Event()

    @app.task(name="sp.work")
    async def work(n: int, length: float) -> None:
        started[n] = time.time()
        if len(started) >= submitted[0]:
            all_started.set()
        await asyncio.sleep(length)

    predicted: dict[int, tuple[str, float, float, float]] = {}  # n -> tenant, at, wait, submit
    counter = iter(range(10**9))

    async def submit_stream(tenant: str, rate: float, t0: float) -> None:
        length = TENANTS[tenant][1]
        while time.time() - t0 < seconds:
            await asyncio.sleep(rng.expovariate(rate))
            n = next(counter)
            sent = time.time()
            answer = await work.submit(
                n, length * rng.uniform(0.75, 1.25), tenant=tenant, estimate_start=True
            )
            if answer.estimated_start is not None and sent - t0 >= warmup:
                at = answer.estimated_start.timestamp()
                predicted[n] = (tenant, at, max(0.0, at - sent), sent)

    async with app:
        for tenant, (weight, _) in TENANTS.items():
            await app.tenants.configure(tenant, weight=weight)
        worker = Worker(app, lanes=["default"], concurrency=SLOTS)
        async with asyncio.TaskGroup() as group:
            group.create_task(worker.run())
            t0 = time.time()
            async with asyncio.TaskGroup() as producers:
                for tenant, rate in rates.items():
                    producers.create_task(submit_stream(tenant, rate, t0))
            # let every job start
            submitted[0] = next(counter)
            if len(started) >= submitted[0]:
                all_started.set()
            await asyncio.wait_for(all_started.wait(), seconds * 4)
            worker.stop()
        await app.purge()
    return _report(predicted, started)


def _errors(rows: list[tuple[float, float]]) -> dict[str, float]:
    rel = [abs(p - r) / r for p, r in rows if r > 0]
    signed = [(p - r) / r for p, r in rows if r > 0]
    absolute = [abs(p - r) for p, r in rows]
    return {
        "abs_error_median_s": round(statistics.median(absolute), 3) if absolute else None,
        "abs_error_p90_s": round(_percentile(absolute, 0.9), 3),
        "real_wait_median_s": round(statistics.median([r for _, r in rows]), 3) if rows else None,
        "predicted_wait_median_s": round(statistics.median([p for p, _ in rows]), 3)
        if rows
        else None,
        "jobs": len(rel),
        "median": round(statistics.median(rel), 3) if rel else float("nan"),
        "p90": round(_percentile(rel, 0.9), 3),
        "mean_signed": round(statistics.fmean(signed), 3) if signed else float("nan"),
    }


def _report(
    predicted: dict[int, tuple[str, float, float, float]], started: dict[int, float]
) -> dict[str, Any]:
    rows: dict[str, list[tuple[float, float]]] = {t: [] for t in TENANTS}
    for n, (tenant, _at, wait, sent) in predicted.items():
        if n in started:
            rows[tenant].append((wait, started[n] - sent))
    every = [r for rs in rows.values() for r in rs]
    waited = [
        (p, r) for t, rs in rows.items() for p, r in rs if r >= TENANTS[t][1]
    ]  # waited at least one of its tenant's job lengths
    return {
        "all": _errors(every),
        "waited_a_job": _errors(waited),
        "by_tenant": {t: _errors(rs) for t, rs in rows.items()},
        "real_wait_median_s": round(statistics.median([r for _, r in every]), 3) if every else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.startpredict")
    parser.add_argument("--url", help="a server to use (default: a private one)")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=6.0)
    parser.add_argument("--rate-a", type=float, default=30.0)
    parser.add_argument("--rate-b", type=float, default=60.0)
    parser.add_argument("--rate-c", type=float, default=22.0)
    parser.add_argument("--light", action="store_true", help="c submits 10 per s")
    args = parser.parse_args(argv)
    rates = {"a": args.rate_a, "b": args.rate_b, "c": 10.0 if args.light else args.rate_c}

    def run(url: str) -> dict[str, Any]:
        return asyncio.run(_run(url, rates, args.seconds, args.warmup))

    if args.url:
        out = run(args.url)
    else:
        with RedisServer() as server:
            out = run(server.url)
    out["rates_per_s"] = rates
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
