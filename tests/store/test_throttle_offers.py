"""Offers of a throttle key on the real store: a woken job that will not run gives its
offer back, and the key wakes its next waiter at once.

``test_model_vs_lua.py`` holds the scripts to the reference model, which has no
cancellation and no deadlines; these are the two ways a woken job (queued again, with
offers) leaves without running: it is cancelled, or its deadline passes before its
dispatch (the dispatch expires it and hands the offer on in the same call).
"""

from __future__ import annotations

import asyncio

import pytest

from fairlane.store.api import Store
from fairlane.store.wire import NewJob, Outcome

pytestmark = pytest.mark.anyio

LANE, KEY = "a", "model:big"


def _job(job_id: str, *, deadline: str = "") -> NewJob:
    return NewJob(
        id=job_id, tenant="t", priority=0, task="t.job", args="{}", max_attempts=1,
        backoff="0,0,none", timeout=0, keep_completed="-1,-1", keep_failed="-1,-1",
        deadline=deadline, limits=[(KEY, 1)],
    )  # fmt: skip


async def _state(store: Store, job_id: str) -> tuple[str | None, str | None]:
    st, toff = await store.client.hmget(store.keys.job(job_id), ["st", "toff"])
    return (st and st.decode(), toff and toff.decode())


async def _key(store: Store) -> tuple[int, int]:
    used, offers = await store.client.hmget(store.keys.throttles, [f"u:{KEY}", f"o:{KEY}"])
    return int(used or 0), int(offers or 0)


async def test_a_cancelled_woken_job_passes_its_offer_on(store: Store) -> None:
    await store.enqueue(LANE, [_job("j1"), _job("j2"), _job("j3")])
    got = await store.exchange("w", [LANE], 3, 60_000)
    assert [j.id for j in got.jobs] == ["j1"]  # j2 and j3 park on the key
    assert await _state(store, "j2") == ("throttled", None)
    done = await store.exchange("w", [LANE], 0, 60_000, [Outcome("j1", got.jobs[0].token, "ok")])
    assert done.ack_codes == [1]
    # j1's release woke j2: back in its queue with an offer, holding no slot
    assert await _state(store, "j2") == ("queued", "1")
    assert await _key(store) == (0, 1)
    assert await store.cancel("j2") == "cancelled"
    assert await _state(store, "j3") == ("queued", "1")  # the offer went on to j3
    assert await _key(store) == (0, 1)
    got = await store.exchange("w", [LANE], 3, 60_000)
    assert [j.id for j in got.jobs] == ["j3"]
    assert await _key(store) == (1, 0)
    ttok = await store.client.hget(store.keys.job("j3"), "ttok")
    assert ttok is not None


async def test_a_woken_job_past_its_deadline_passes_its_offer_on(store: Store) -> None:
    await store.enqueue(LANE, [_job("j1"), _job("j2", deadline="+150"), _job("j3")])
    got = await store.exchange("w", [LANE], 3, 60_000)
    assert [j.id for j in got.jobs] == ["j1"]
    await store.exchange("w", [LANE], 0, 60_000, [Outcome("j1", got.jobs[0].token, "ok")])
    assert await _state(store, "j2") == ("queued", "1")
    await asyncio.sleep(0.3)
    # the dispatch expires j2, which gives its offer back; j3 is woken and, in the
    # same call, takes the key with its lane slot
    got = await store.exchange("w", [LANE], 3, 60_000)
    assert [j.id for j in got.jobs] == ["j3"]
    assert (await _state(store, "j2"))[0] == "expired"
    assert await _key(store) == (1, 0)


def _two_key_job(job_id: str) -> NewJob:
    return NewJob(
        id=job_id, tenant="t", priority=0, task="t.job", args="{}", max_attempts=1,
        backoff="0,0,none", timeout=0, keep_completed="-1,-1", keep_failed="-1,-1",
        limits=[(KEY, 1), ("doc:7", 1)],
    )  # fmt: skip


async def test_a_cancelled_woken_job_on_two_keys_leaves_neither_key_behind(store: Store) -> None:
    await store.enqueue(LANE, [_two_key_job("k1"), _two_key_job("k2")])
    got = await store.exchange("w", [LANE], 2, 60_000)
    assert [j.id for j in got.jobs] == ["k1"]
    await store.exchange("w", [LANE], 0, 60_000, [Outcome("k1", got.jobs[0].token, "ok")])
    assert await _state(store, "k2") == ("queued", "1")  # an offer on both keys
    assert await store.cancel("k2") == "cancelled"
    # nobody holds, is offered or waits on either key: both are forgotten, no offer kept
    fields = [f.decode() for f in await store.client.hkeys(store.keys.throttles)]
    assert not [f for f in fields if f.endswith((KEY, "doc:7"))], fields
    assert await store.client.zcard(store.keys.throttle_waiters) == 0
    assert (await store.exchange("w", [LANE], 2, 60_000)).jobs == []
