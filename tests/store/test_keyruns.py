"""Keys by the run (``lua/keyruns.lua``): a dispatch call's jobs that name the same keys
pass them on what the run's first job found, and must decide exactly as
``throttle.thr_acquire`` decides each job alone.

Each case enqueues the same jobs into two apps on the real server and drains them two
ways: one exchange asking for all of them (a run wherever jobs repeat their keys), and
one exchange per job (every job decided in full, as the first of its call); then they
complete what was leased the same two ways (releases in a run, and each alone) and
lease what that let start. Both must lease the same jobs in the same order and leave
the same throttle state after each step: slots held, offers, references, limits and
rates in force, grant tokens, waiters and their groups, and the rate keys' tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from fairlane.store.api import Store
from fairlane.store.wire import FetchedJob, NewJob, Outcome

pytestmark = pytest.mark.anyio

HOUR = 3_600_000
#: a rate that does not refill within a test: its tokens are its burst
SLOW = 1e12

Spec = tuple[str, list[list[Any]], list[tuple[str, float, float, float, int]]]


def _jobs(specs: Sequence[Spec]) -> list[NewJob]:
    return [
        NewJob(f"j{i:03d}", tenant, 0, "kr.job", "[]", 3, "", 0, "0,0", "0,0",
               limits=limits, rates=rates)
        for i, (tenant, limits, rates) in enumerate(specs)
    ]  # fmt: skip


UP = [["up", 5]]
WIDE = [["up", 50]]
API = [("api", 4.0, SLOW, 4.0, 0)]
PLENTY = [("api", 100.0, SLOW, 100.0, 0)]

CASES = {
    "the limit binds mid-run": [("t", UP, PLENTY)] * 12,
    "the rate binds mid-run": [("t", WIDE, API)] * 9,
    "two tenants share the run": [("a", UP, PLENTY), ("b", UP, PLENTY)] * 5,
    "the keys change from job to job": [("t", UP, []), ("t", [], API), ("t", UP, API)] * 4,
    "a limit alone": [("t", [["solo", 3]], [])] * 6,
    "every job fits, and the last release drops the keys": [("t", WIDE, PLENTY)] * 6,
    "a second run after a change": [("t", UP, PLENTY)] * 3 + [("t", [["up", 7]], PLENTY)] * 6,
}


async def _drain(store: Store, specs: Sequence[Spec], per_call: int) -> list[FetchedJob]:
    await store.enqueue("a", _jobs(specs))
    leased: list[FetchedJob] = []
    for _ in range(len(specs) if per_call == 1 else 1):
        got = await store.exchange("w", ["a"], per_call, HOUR, slots=len(specs))
        leased.extend(got.jobs)
    return leased


async def _settle(store: Store, jobs: Sequence[FetchedJob], per_call: int) -> list[FetchedJob]:
    """Complete ``jobs``, ``per_call`` to an exchange that asks for nothing more; then
    lease what their released keys let start."""
    for i in range(0, len(jobs), per_call):
        done = [Outcome(j.id, j.token, "ok", "1") for j in jobs[i : i + per_call]]
        got = await store.exchange("w", ["a"], 0, HOUR, done, slots=len(jobs))
        assert set(got.ack_codes) == {1}
    return (await store.exchange("w", ["a"], len(jobs), HOUR, slots=len(jobs))).jobs


async def _throttle_state(store: Store) -> dict[str, Any]:
    client, keys = store.client, store.keys
    fields = {f.decode(): v.decode() for f, v in (await client.hgetall(keys.throttles)).items()}
    # a parked job's record holds when it parked: the same job, parked at another time
    parked = {f for f in fields if f.startswith("p:")}
    kept = {f: v for f, v in fields.items() if f not in parked}
    waiters = [m.decode() for m in await client.zrange(keys.throttle_waiters, 0, -1)]
    tokens = {}
    for key in ("api",):
        raw = await client.hget(keys.rate_state(key), "t")
        tokens[key] = None if raw is None else round(float(raw), 6)
    return {"fields": kept, "parked": sorted(parked), "waiters": waiters, "tokens": tokens}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_run_decides_as_each_job_alone(
    store: Store, redis_url: str, namespace: str, case: str
) -> None:
    specs = CASES[case]
    alone = Store.from_url(redis_url, f"{namespace}-alone")
    await alone.connect()
    try:
        in_one_call = await _drain(store, specs, per_call=len(specs))
        one_by_one = await _drain(alone, specs, per_call=1)
        assert [j.id for j in in_one_call] == [j.id for j in one_by_one]
        assert await _throttle_state(store) == await _throttle_state(alone)
        # the releases: all in one call, and one to a call
        after = await _settle(store, in_one_call, per_call=len(in_one_call))
        after_alone = await _settle(alone, one_by_one, per_call=1)
        assert [j.id for j in after] == [j.id for j in after_alone]
        assert await _throttle_state(store) == await _throttle_state(alone)
    finally:
        leftover = [k async for k in alone.client.scan_iter(match=alone.keys.match_all())]
        if leftover:
            await alone.client.delete(*leftover)
        await alone.aclose()
