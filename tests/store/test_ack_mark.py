"""The mark an ack reads a job's record by (``x``, lua core.read). An enqueue that writes
optional fields none of which an ack reads (keys, a fairness key) marks them '-', and
the ack then reads what a plain job's reads; one that writes a field the ack reads marks
'1', as does a writer that adds one while the job runs. A keyed job's lease adds its
throttle grant (``ttok``) and leaves the mark as it was: the ack reads the grant with
the common fields. Whatever the mark, the ack must find what it needs: the grant it
releases (the next job on the key starts), the waiter it answers, the deadline.
"""

from __future__ import annotations

import pytest

from fairlane.store.api import Store
from fairlane.store.wire import NewJob, Outcome

pytestmark = pytest.mark.anyio

HOUR = 3_600_000
ONE_SLOT = [["solo", 1]]


def _job(job_id: str, deadline: str = "") -> NewJob:
    return NewJob(job_id, "t", 0, "mark.job", "[]", 3, "", 0, "0,0", "0,0",
                  deadline=deadline, limits=ONE_SLOT)  # fmt: skip


async def _mark(store: Store, job_id: str) -> bytes | None:
    mark: bytes | None = await store.client.hget(store.keys.job(job_id), "x")
    return mark


async def _second_starts_when_the_first_is_done(store: Store, first: str, second: str) -> None:
    got = await store.exchange("w", ["a"], 0, HOUR, slots=2)
    # the key's one slot is held: nothing more starts before the first job is done
    assert got.jobs == []
    leased = await store.client.hget(store.keys.job(first), "tok")
    assert leased is not None
    done = [Outcome(first, leased.decode(), "ok", "1")]
    got = await store.exchange("w", ["a"], 2, HOUR, done, slots=2)
    assert got.ack_codes == [1]
    assert [j.id for j in got.jobs] == [second]


@pytest.mark.parametrize(
    ("deadline", "mark"),
    [("", b"-"), (f"+{HOUR}", b"1")],
    ids=["the grant alone", "with a deadline"],
)
async def test_a_keyed_lease_leaves_the_mark_and_its_ack_finds_the_grant(
    store: Store, deadline: str, mark: bytes
) -> None:
    await store.enqueue("a", [_job("k1", deadline), _job("k2", deadline)])
    got = await store.exchange("w", ["a"], 1, HOUR, slots=2)
    assert [j.id for j in got.jobs] == ["k1"]
    assert await _mark(store, "k1") == mark
    assert await store.client.hget(store.keys.job("k1"), "ttok") is not None
    await _second_starts_when_the_first_is_done(store, "k1", "k2")
    # the release took the grant out of the record
    assert await store.client.hget(store.keys.job("k1"), "ttok") is None


async def test_a_waiter_added_while_it_runs_widens_the_mark(store: Store) -> None:
    await store.enqueue("a", [_job("k1"), _job("k2")])
    got = await store.exchange("w", ["a"], 1, HOUR, slots=2)
    assert [j.id for j in got.jobs] == ["k1"]
    assert await _mark(store, "k1") == b"-"
    assert await store.watch("k1") == [b"running"]
    assert await _mark(store, "k1") == b"1"
    pubsub = store.client.pubsub()
    await pubsub.subscribe(store.keys.prefix + "done")
    try:
        await _second_starts_when_the_first_is_done(store, "k1", "k2")
        # the ack read the waiter too: it tells those waiting that the job is done
        heard = []
        for _ in range(10):
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
            if message is not None:
                heard.append(message["data"])
                break
        assert heard == [b"k1"]
    finally:
        await pubsub.aclose()


async def _hmgets(store: Store) -> int:
    stats = await store.client.info("commandstats")
    calls: int = stats.get("cmdstat_hmget", {}).get("calls", 0)
    return calls


async def _ack_reads(store: Store, job_id: str, **options: str) -> tuple[bytes | None, int]:
    """The mark of ``job_id``, enqueued with ``options``, and the HMGETs of settling it once
    it runs."""
    job = NewJob(job_id, "t", 0, "mark.job", "[]", 3, "", 0, "0,0", "0,0", **options)  # type: ignore[arg-type]
    await store.enqueue("a", [job])
    mark = await _mark(store, job_id)
    got = await store.exchange("w", ["a"], 1, HOUR, slots=1)
    assert [j.id for j in got.jobs] == [job_id]
    before = await _hmgets(store)
    done = [Outcome(job_id, got.jobs[0].token, "ok", "1")]
    settled = await store.exchange("w", ["a"], 0, HOUR, done, slots=1)
    assert settled.ack_codes == [1]
    return mark, await _hmgets(store) - before


async def test_an_enqueue_marks_whether_the_ack_reads_an_optional_field(store: Store) -> None:
    # a fairness key is dispatch's alone: its record holds an optional field, none of
    # them one the ack reads, and its ack reads what a plain job's does
    mark, plain = await _ack_reads(store, "p1")
    assert mark is None
    assert await _ack_reads(store, "f1", fairness_key="user-1") == (b"-", plain)
    # an idempotency key is one the ack reads
    mark, reads = await _ack_reads(store, "i1", fairness_key="user-1", idempotency_key="once")
    assert mark == b"1"
    assert reads > plain
