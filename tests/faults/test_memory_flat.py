"""Server memory stays flat across a long run of short jobs with retention set.

A CI-sized run of ``benchmarks/memory.py``: 100,000 no-op jobs through one worker,
1,000 completed records retained, the server's ``used_memory`` sampled 20 times. After
warm-up (20 % of the jobs) the level must stay within 1.3x of the level at warm-up, and
the server must hold no more than the retained records once the run has drained.
Anything kept per job (a record, an index entry, an event list, an idempotency entry)
would grow with every job: at 100,000 jobs, even 50 bytes each would show.
"""

from __future__ import annotations

import pytest
import redis
from benchmarks.memory import measure

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.embedded_only]

JOBS, KEEP = 100_000, 1000
BOUND = 1.3


async def test_memory_is_flat_across_100000_jobs(redis_url: str, namespace: str) -> None:
    run = await measure(redis_url, JOBS, keep=KEEP, app_name=namespace, keep_keys=True)
    print("\n" + run.report())
    client = redis.Redis.from_url(redis_url)
    try:
        records = sum(1 for _ in client.scan_iter(match=f"{{fl:{namespace}}}:job:*", count=1000))
    finally:
        client.close()
    assert records == KEEP, f"{records} job records left, retention keeps {KEEP}"
    assert run.growth < BOUND, f"used_memory grew {run.growth:.2f}x after warm-up"
