"""Measured shares against weights, through the real store.

Three tenants with weights 5:3:2 each queue more jobs than will be dispatched; a
worker id leases ``dispatches`` jobs through the store's ``exchange`` (the same call
the worker makes, with the Lua fair queue deciding) and settles them as it goes. The
report is each tenant's share of the dispatched jobs next to its weight's share, and
the largest gap in percentage points. A second run gives the heaviest tenant jobs
that are ten times wider in slots, so the shares are also shown by slots.

Run: ``python -m benchmarks.shares [--redis-url URL] [--dispatches 10000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections import Counter
from typing import Any

from benchmarks.common import delete_matching
from fairlane.store.api import Store
from fairlane.store.wire import NewJob, Outcome

DEFAULT_URL = "redis://127.0.0.1:6379/0"
WEIGHTS = {"t5": 5.0, "t3": 3.0, "t2": 2.0}
LANE = "default"


def _jobs(tenant: str, count: int, slots: int) -> list[NewJob]:
    return [
        NewJob(f"{tenant}-{i}", tenant, 0, "bench.noop", "[]", 1, "", 0, "0,0", "0,0", slots=slots)
        for i in range(count)
    ]


async def measure(url: str, dispatches: int, *, wide: bool) -> dict[str, Any]:
    app = f"flshares_{os.getpid()}_{int(wide)}"
    store = Store.from_url(url, app)
    await store.connect()
    try:
        for tenant, weight in WEIGHTS.items():
            await store.configure_tenant(tenant, weight)
            slots = 10 if wide and tenant == "t5" else 1
            for first in range(0, dispatches, 5_000):
                await store.enqueue(LANE, _jobs(tenant, min(5_000, dispatches - first), slots))
        jobs: Counter[str] = Counter()
        slots_used: Counter[str] = Counter()
        outcomes: list[Outcome] = []
        while sum(jobs.values()) < dispatches:
            fetched = await store.exchange("meter", [LANE], 10, 60_000, outcomes, slots=10)
            outcomes = [Outcome(j.id, j.token, "ok") for j in fetched.jobs]
            for job in fetched.jobs[: dispatches - sum(jobs.values())]:
                jobs[job.tenant] += 1
                slots_used[job.tenant] += job.slots
    finally:
        await delete_matching(store.client, f"{store.keys.prefix}*")
        await store.aclose()
    total_weight = sum(WEIGHTS.values())
    rows = {
        tenant: {
            "weight_share": WEIGHTS[tenant] / total_weight,
            "job_share": jobs[tenant] / dispatches,
            "slot_share": slots_used[tenant] / sum(slots_used.values()),
        }
        for tenant in WEIGHTS
    }
    gap = max(abs(r["job_share"] - r["weight_share"]) for r in rows.values())
    return {"wide_t5": wide, "dispatches": dispatches, "shares": rows, "max_gap_pp": 100 * gap}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=DEFAULT_URL)
    parser.add_argument("--dispatches", type=int, default=10_000)
    args = parser.parse_args()
    results = [
        asyncio.run(measure(args.redis_url, args.dispatches, wide=wide)) for wide in (False, True)
    ]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
