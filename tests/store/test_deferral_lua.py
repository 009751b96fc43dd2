"""Fair deferral in the store, where the agreement test does not go: jobs that leave a
class's deferred queue without being admitted.

A cancelled deferred job leaves the class's index at once and its tenant's group when a
readmission pass reaches it, uncharged (``drop``); a deferred job whose deadline passed
while it waited is expired by the pass. Either way the pass goes on to the next head, the
pin follows the job out, and nothing of the tenant is left behind.
"""

from __future__ import annotations

from typing import Any, cast

import anyio
import pytest

from fairlane.policy.admission import AdmissionClass, EstimationSettings, PoolConfig
from fairlane.policy.admission.deferral import OVERTAKE_LIMIT
from fairlane.policy.classes import ClassTable, ServiceClass
from fairlane.store.api import Store
from fairlane.store.wire import NewJob, Outcome

pytestmark = pytest.mark.anyio

LANE, CLS, WORKER, LONG = "dl", "std", "w1", 600_000
TABLE = ClassTable((ServiceClass(CLS, nominal_share=1.0),))
POOL = PoolConfig(
    capacity_units=2.0,
    classes=(AdmissionClass(CLS, max_queue=50, max_deferred=50, when_full="defer"),),
)


def job(job_id: str, tenant: str, mu: int, deadline: str = "") -> NewJob:
    return NewJob(
        job_id, tenant, 0, "dl.job", "[]", 1, "", 0, "0,0", "100,-1",
        deadline=deadline, service_class=CLS, declared_mu=mu, declared=1,
    )  # fmt: skip


async def declare(store: Store) -> None:
    await store.declare_lane(LANE, TABLE, "jobs")
    await store.declare_admission(
        LANE, TABLE, POOL, EstimationSettings(max_reservation_units=2, safety_multiplier=1.0)
    )
    await store.exchange(WORKER, [LANE], 0, LONG, slots=10)


async def lease_and_ack(store: Store) -> list[str]:
    """Lease what is queued, ack it ``ok``: the releases run one readmission pass."""
    got = await store.exchange(WORKER, [LANE], 10, LONG, slots=10)
    outcomes = [Outcome(j.id, j.token, "ok") for j in got.jobs]
    await store.exchange(WORKER, [LANE], 0, LONG, outcomes, slots=10)
    return [j.id for j in got.jobs]


async def deferral_state(store: Store) -> dict[str, Any]:
    client, keys = store.client, store.keys
    key = lambda what: keys.class_key(LANE, CLS, what)  # noqa: E731
    groups = sorted([k.decode() async for k in client.scan_iter(match=key("dq:*"))])
    return {
        "index": [m.decode() for m in await client.zrange(key("deferred"), 0, -1)],
        "groups": [g[len(key("dq:")) :] for g in groups],
        "active": [m.decode() for m in await client.zrange(key("dfair"), 0, -1)],
        "pin": await client.hget(key("dvt"), "pin"),
        "ad": int(await client.hget(keys.lane(LANE).state, f"ad:{CLS}") or 0),
    }


async def status(store: Store, job_id: str) -> str | None:
    raw = cast("bytes | None", await store.client.hget(store.keys.job(job_id), "st"))
    return None if raw is None else raw.decode()


async def test_a_cancelled_deferred_job_leaves_its_group_uncharged(store: Store) -> None:
    await declare(store)
    replies = await store.submit(
        LANE, [job("run", "a", 2000), job("gone", "b", 1000), job("next", "c", 1000)]
    )
    assert [r.code for r in replies] == [1, 2, 2]
    assert await store.cancel("gone") == "cancelled"
    # the index and the count let go at once; the group and its tag wait for a pass
    state = await deferral_state(store)
    assert state["index"] == ["next"] and state["ad"] == 1
    assert state["groups"] == ["b", "c"] and state["active"] == ["b", "c"]
    await lease_and_ack(store)
    # the pass met b's cancelled head first (least tag, then name), dropped it and
    # admitted c's job; nothing of b is left
    assert await status(store, "next") == "queued"
    assert await status(store, "gone") == "cancelled"
    state = await deferral_state(store)
    assert state == {"index": [], "groups": [], "active": [], "pin": None, "ad": 0}
    # and with nothing deferred, no V and no finish tag either
    for what in ("dvt", "didle"):
        assert await store.client.exists(store.keys.class_key(LANE, CLS, what)) == 0


async def test_a_pinned_deferred_job_that_expires_unpins_its_class(store: Store) -> None:
    await declare(store)
    # two running jobs fill the pool; a wide job with a deadline soon, then small ones
    replies = await store.submit(
        LANE,
        [
            job("run1", "z", 1000),
            job("run2", "z", 1000),
            job("wide", "a", 2000, deadline="+1500"),
            job("small1", "b", 1000),
            job("small2", "b", 1000),
        ],
    )
    assert [r.code for r in replies] == [1, 1, 2, 2, 2]
    got = await store.exchange(WORKER, [LANE], 10, LONG, slots=10)
    tokens = {j.id: j.token for j in got.jobs}
    assert set(tokens) == {"run1", "run2"}
    await store.exchange(WORKER, [LANE], 0, LONG, [Outcome("run1", tokens["run1"], "ok")], slots=10)
    # one unit free: the wide head (tenant a, tried first) does not fit and is pinned;
    # small1 gets in past it
    assert await status(store, "small1") == "queued"
    state = await deferral_state(store)
    assert state["pin"] == b"wide" and state["index"] == ["wide", "small2"]
    overtakes = await store.client.hget(store.keys.lane(LANE).state, f"ao:{CLS}")
    assert overtakes == b"1"
    # its deadline passes while it waits; the next pass expires it, and the pin goes
    await anyio.sleep(1.7)
    await store.exchange(WORKER, [LANE], 0, LONG, [Outcome("run2", tokens["run2"], "ok")], slots=10)
    assert await status(store, "wide") == "expired"
    assert await status(store, "small2") == "queued"
    state = await deferral_state(store)
    assert state == {"index": [], "groups": [], "active": [], "pin": None, "ad": 0}
    assert await store.client.hget(store.keys.lane(LANE).state, f"ao:{CLS}") is None


async def test_cancelling_the_pinned_head_of_a_held_class_admits_what_fits_at_once(
    store: Store,
) -> None:
    await declare(store)
    smalls = [f"small{i}" for i in range(1, 11)]
    replies = await store.submit(
        LANE,
        [job("run1", "z", 1000), job("run2", "z", 1000), job("wide", "a", 2000)]
        + [job(s, "b", 1000) for s in smalls],
    )
    assert [r.code for r in replies] == [1, 1] + [2] * 11
    got = await store.exchange(WORKER, [LANE], 10, LONG, slots=10)
    token = {j.id: j.token for j in got.jobs}["run1"]
    await store.exchange(WORKER, [LANE], 0, LONG, [Outcome("run1", token, "ok")], slots=10)
    # run2 keeps one unit: the wide head never fits, each release lets one small job past
    for _ in range(OVERTAKE_LIMIT - 1):
        assert len(await lease_and_ack(store)) == 1
    overtakes = await store.client.hget(store.keys.lane(LANE).state, f"ao:{CLS}")
    assert overtakes == str(OVERTAKE_LIMIT).encode()
    # the last small one admitted runs and ends: the class is held, so the pass tries the
    # wide head alone, and one unit stays free with small9 and small10 deferred
    assert await lease_and_ack(store) == [smalls[OVERTAKE_LIMIT - 1]]
    assert await status(store, smalls[OVERTAKE_LIMIT]) == "deferred"
    assert (await deferral_state(store))["pin"] == b"wide"
    assert await store.cancel("wide") == "cancelled"
    # the cancel ran the pass itself: the pin went with the job and the next small job is
    # in; the last one finds the pool full and is the new pin, overtaken by nobody yet
    assert await status(store, smalls[OVERTAKE_LIMIT]) == "queued"
    state = await deferral_state(store)
    assert state["index"] == ["small10"] and state["pin"] == b"small10"
    assert await store.client.hget(store.keys.lane(LANE).state, f"ao:{CLS}") == b"0"
