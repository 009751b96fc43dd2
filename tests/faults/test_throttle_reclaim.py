"""A throttle slot across kill -9 and reclaim: never two holders, never a lost slot.

Four jobs share the key ``doc:x`` with limit 1. The first worker starts one of them and
is SIGKILLed mid-run; a second worker is already serving the lane. Until the dead
worker's lease is reclaimed its job still holds the key, so the survivor must start
none of the others; the reclaim frees the slot and hands it on (to the next waiter or
to the reclaimed job, which comes back through the same gate). The test polls the
store throughout: at most one of the jobs is ever running and the key's in-use count
never exceeds 1; in the end all four complete and the killed one ran twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.worker_proc import Fleet, build_app, eventually, wait_ready, worker_env

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LEASE, RENEW, SWEEP = 1.5, 0.3, 0.5
HOLD = 1.0  # s each job holds the key


async def test_a_killed_holder_keeps_its_slot_until_reclaimed(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    ledger = f"{{fl:{namespace}}}:ledger"
    app, tasks = build_app(namespace, redis_url, lease=LEASE, renew=RENEW, sweep=SWEEP)
    env = worker_env(namespace, redis_url, ledger, lease=LEASE, renew=RENEW, sweep=SWEEP)
    async with app:
        client, keys = app.store.client, app.store.keys
        with Fleet(env, tmp_path) as fleet:
            victim = fleet.start()
            await wait_ready(app, victim.pid)
            jobs = await tasks.hold.enqueue_many(
                [(HOLD, f"h{n}") for n in range(4)], limits={"doc:x": 1}
            )

            async def one_started() -> bool:
                return int(await client.llen(ledger)) >= 1

            await eventually(one_started, "the first job to start", timeout=30)
            survivor = fleet.start()
            await wait_ready(app, survivor.pid)
            Fleet.kill(victim)

            most_running = most_in_use = 0

            async def all_done() -> bool:
                nonlocal most_running, most_in_use
                pipe = client.pipeline(transaction=False)
                for job in jobs:
                    pipe.hget(keys.job(job.id), "st")
                pipe.hget(keys.throttles, "u:doc:x")
                *statuses, in_use = await pipe.execute()
                most_running = max(most_running, statuses.count(b"running"))
                most_in_use = max(most_in_use, int(in_use or 0))
                return all(st == b"completed" for st in statuses)

            await eventually(all_done, "all four jobs to complete", timeout=60, step=0.02)
            assert survivor.poll() is None
        entries = [e.decode() for e in await client.lrange(ledger, 0, -1)]
        attempts = [int(await client.hget(keys.job(j.id), "att") or 0) for j in jobs]
        held = await client.hget(keys.throttles, "u:doc:x")
    assert most_running == 1, most_running
    assert most_in_use == 1, most_in_use
    # the killed attempt counted and its job ran again; nothing else ran twice
    assert sorted(attempts) == [1, 1, 1, 2], attempts
    assert len(entries) == 5, entries
    # the key is forgotten once nobody holds or waits for it
    assert held is None
