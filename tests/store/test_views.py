"""The store's read models: each plan fed replies by hand (no server), and read through
both runners on a real server, where the synchronous and the asyncio client must give
the same snapshot.

The plans hold every key, field and parser the faces read through (the dashboard, the
metrics collector, ``inspect load``, the demo); these tests pin what they make of the
replies: a lane parsed once and merged over shards, tenants and throttle keys merged,
job ids found through the indexes, and the round trips each read takes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fairlane.policy.shards import shard_of_tenant
from fairlane.store.api import Store
from fairlane.store.connection import create_sync_client
from fairlane.store.keys import AppKeys
from fairlane.store.reads import Cmd, Plan, run_sync
from fairlane.store.views.fleet import fleet_counts, live_workers, running_slots
from fairlane.store.views.jobs import Filter, candidates, listing
from fairlane.store.views.lanes import LaneState, lane_states, merge_lanes, parse_lane_state
from fairlane.store.views.tenants import lane_tenants
from fairlane.store.views.throttles import throttles
from fairlane.store.views.totals import app_totals, split_stats
from fairlane.store.views.waits import oldest_waiting, start_delays
from fairlane.store.wire import NewJob, Outcome

T = Any


def drive(plan: Plan[T], *replies: list[Any]) -> tuple[T, list[list[Cmd]]]:
    """Run ``plan`` on the given replies, one list per round trip; the result and the
    batches it asked for."""
    asked: list[list[Cmd]] = []
    for reply in (None, *replies):
        if reply is not None:
            assert len(reply) == len(asked[-1]), asked[-1]
        try:
            asked.append(next(plan) if reply is None else plan.send(reply))
        except StopIteration as done:
            return done.value, asked
    raise AssertionError(f"the plan asked for more: {asked[-1]}")


def shard_keys(count: int) -> list[AppKeys]:
    return [AppKeys.for_shard("views", i, count) for i in range(count)]


# -- lanes -----------------------------------------------------------------------------


def test_a_lane_state_is_parsed_once_and_leniently() -> None:
    raw = {
        b"C": b"8",
        b"f:standard": b"3",
        b"d:standard": b"-1",
        b"d:batch": b"4",
        b"ad:batch": b"2",
        b"ar:batch": b"1500",
        b"an:batch": b"1",
        b"table": b"\x93\x01\x02",  # the class table: not a count
        b"f:broken": b"x",
        b"charge": b"cost",
    }
    state = parse_lane_state(raw, 5)
    assert state == LaneState(
        8,
        {"standard": 3},
        {"standard": -1, "batch": 4},
        {"batch": 2},
        {"batch": 1500},
        {"batch": 1},
        5,
    )
    assert state.clamped().waiting == {"standard": 0, "batch": 4}
    assert parse_lane_state({}) == LaneState(0, {}, {})


def test_a_lane_over_shards_sums_slots_but_not_capacity() -> None:
    one = LaneState(6, {"a": 1}, {"a": 2}, delayed=1)
    two = LaneState(8, {"a": 2, "b": 1}, {}, {"b": 3}, delayed=2)
    assert merge_lanes([one, two]) == LaneState(8, {"a": 3, "b": 1}, {"a": 2}, {"b": 3}, {}, {}, 3)
    assert merge_lanes([one]) is one
    merged, asked = drive(
        lane_states(shard_keys(2), ["gpu"]),
        [{b"C": b"4", b"f:x": b"1"}, 0, {b"C": b"5", b"f:x": b"2"}, 3],
    )
    assert merged == {"gpu": LaneState(5, {"x": 3}, {}, delayed=3)}
    assert len(asked) == 1  # one round trip


def test_app_totals_split_counters_from_decisions() -> None:
    keys = shard_keys(2)
    lane = [{b"C": b"2"}, 0]
    totals, asked = drive(
        app_totals(keys, ["default"]),
        [
            *lane,
            {
                b"completed": b"3",
                b"fifo": b"9",
                b"layout": b"2",
                b"adm:accepted:none:default:standard": b"2",
            },
            1,
            *lane,
            {b"completed": b"4", b"adm:rejected:class_full:default:standard": b"1"},
            2,
        ],
    )
    assert totals.stats == {"completed": 7}
    assert totals.decisions == {
        ("default", "standard", "accepted", "none"): 2,
        ("default", "standard", "rejected", "class_full"): 1,
    }
    assert totals.throttle_waiters == 3 and len(totals.lanes) == 2 and len(asked) == 1
    assert split_stats({"adm:odd": 1, "fifo": 2, "layout": 2, "failed": 1}) == ({"failed": 1}, {})


# -- ages and delays -------------------------------------------------------------------


def test_oldest_waiting_reads_queue_heads_and_the_clock_of_their_shard() -> None:
    keys = shard_keys(2)
    lanes = [
        {"gpu": LaneState(1, {}, {"standard": 2, "batch": 0})},
        {"gpu": LaneState(1, {}, {"standard": 0})},
    ]
    ages, asked = drive(
        oldest_waiting(keys, lanes, 8),
        [[b"acme", b"beta"]],  # shard 0 standard: its active tenants
        [[b"j-acme"], [b"j-beta"]],  # their queue heads
        # run, enq of the two heads (and the status and enq every projection reads); TIME
        [[b"1000", b"900", b"queued", b"900"], [None, b"500", b"queued", b"500"], 4000],
    )
    assert ages == {("gpu", "standard"): 3.5, ("gpu", "batch"): 0.0}  # j-beta, since enq
    assert [len(batch) for batch in asked] == [1, 2, 3]  # classes * (2 * tenants + 1) + 1
    assert [c.name for c in asked[2]] == ["hmget", "hmget", "time"]
    quiet, asked = drive(oldest_waiting(keys, [{"gpu": LaneState(1, {}, {"a": 0})}], 8))
    assert quiet == {("gpu", "a"): 0.0} and asked == []  # nothing waits: no read at all


def test_start_delays_take_the_newest_of_every_shard() -> None:
    keys = shard_keys(2)
    delays, _ = drive(
        start_delays(keys, ["t"], 2),
        [[(b"a", 10.0), (b"b", 5.0)], [(b"c", 7.0)]],
        [
            [b"gpu", b"standard", b"acme", b"100", b"130", b"running", b"90"],  # a: 30 ms
            # c: 10 ms, class by default
            [b"gpu", None, b"beta", b"100", b"110", b"running", b"90"],
        ],
    )
    assert delays.by_class == {("gpu", "standard"): [30, 10]}
    assert delays.by_tenant == {"acme": [30], "beta": [10]}


# -- the fleet, tenants and throttles --------------------------------------------------


def test_fleet_counts_workers_once_and_weights_from_their_own_shard() -> None:
    keys = shard_keys(2)
    counts, _ = drive(
        fleet_counts(keys),
        [2, 1, 3, {b"acme": b"2.0"}, 4, 0, 3, {b"acme": b"5.0", b"beta": b"0.5"}],
    )
    assert (counts.running, counts.dead, counts.workers) == (6, 1, 3)
    assert counts.weights["acme"] == (2.0 if shard_of_tenant("acme", 2) == 0 else 5.0)
    assert counts.weights["beta"] == 0.5


def test_running_slots_come_from_the_records_of_leased_jobs() -> None:
    held, asked = drive(
        running_slots(shard_keys(1), 100),
        [[b"j1", b"j2", b"j3", b"j4"]],
        [
            [b"gpu", None, b"acme", b"2", b"running", b"1"],
            [None] * 6,
            [b"gpu", b"standard", b"acme", None, b"running", b"1"],
            [None, None, None, None, b"running", b"1"],  # the default lane and tenant
        ],
    )
    assert held == {("gpu", "standard", "acme"): 3, ("default", "standard", "default"): 1}
    assert asked[1][0].args[1] == ["lane", "cls", "tenant", "sl", "st", "enq"]


def test_lane_tenants_merge_shards_and_count_rejections() -> None:
    detail, _ = drive(
        lane_tenants(shard_keys(2), "gpu", ["standard"]),
        [
            {b"C": b"4", b"d:standard": b"2"},
            1,
            {b"acme": b"3|1700000000000"},
            [b"acme"],
            0,
            {b"C": b"4"},
            0,
            {},
            [b"acme", b"beta"],
            2,
        ],
        [2, 1, 5],
    )
    assert detail.queued == {("standard", "acme"): 3, ("standard", "beta"): 5}
    assert detail.deferred == {"standard": 2} and detail.rejected == {"acme": 3}
    assert detail.state == LaneState(4, {}, {"standard": 2}, delayed=1)


def test_throttle_keys_are_summed_over_the_shards_that_hold_them() -> None:
    views, asked = drive(
        throttles(shard_keys(2), 100),
        [{b"l:model": b"2"}, [b"model\x00001\x00j9"], {b"l:model": b"3"}, []],
        [[b"1", b"1", b"1"], [b"2", None, b"2"]],  # each shard's u:, o:, r: of the key
    )
    assert [(v.key, v.limit, v.in_use, v.offers, v.jobs, v.waiters) for v in views] == [
        ("model", 3, 3, 1, 3, ["j9"])
    ]
    assert [c.name for c in asked[0]] == ["hscan", "zrange", "hscan", "zrange"]
    # the offers ride in the same HMGET as the use: still two round trips
    assert (
        len(asked) == 2
        and [c.args[1:] for c in asked[1]] == [("u:model", "o:model", "r:model")] * 2
    )
    nothing, asked = drive(throttles(shard_keys(1), 100), [{}, []])
    assert nothing == [] and len(asked) == 1


# -- finding jobs ----------------------------------------------------------------------


def test_candidates_read_the_indexes_of_the_states_asked_for() -> None:
    keys = shard_keys(1)
    flt = Filter(states=frozenset({"queued", "throttled"}), tenant="acme")
    found, asked = drive(
        candidates(keys, flt, {"gpu": ["standard"]}, ["t"]),
        [[b"acme", b"beta"]],  # the class's active tenants
        [[b"q1"], [b"key\x00acme\x00001\x00w1"]],  # acme's queue (woken jobs too), waiters
    )
    assert found.ids == {"q1": 0, "w1": 0} and not found.truncated
    assert [c.args[0].rsplit(":", 1)[-1] for c in asked[1]] == ["acme", "wait"]


def test_a_listing_leaves_out_records_removed_meanwhile() -> None:
    row = [b"t", b"acme", b"gpu", None, b"failed", b"1", b"1", b"5", b"6", b"7", None, None]
    row += [b"failed", b"5"]  # the status and enq every projection reads
    rows, _ = drive(listing(shard_keys(1), {"a": 0, "b": 0}), [row, 9.0, [None] * 14, None])
    assert [(r.id, r.status, r.service_class, dead) for r, dead in rows] == [
        ("a", "failed", "standard", True)
    ]


# -- both runners on a real server -----------------------------------------------------


@pytest.fixture
def sync_client(redis_url: str) -> Iterator[Any]:
    client = create_sync_client(redis_url, socket_timeout=5.0)
    try:
        yield client
    finally:
        client.close()


def _job(n: int) -> NewJob:
    return NewJob(f"v{n:03d}", f"tenant{n % 2}", 0, "views.job", "[]", 1, "", 0, "0,0", "0,0")


@pytest.mark.anyio
@pytest.mark.contract
async def test_both_runners_read_the_same_snapshot(store: Store, sync_client: Any) -> None:
    await store.enqueue("gpu", [_job(n) for n in range(6)])
    fetched = await store.exchange("w1", ["gpu"], 2, 60_000, slots=4)
    assert len(fetched.jobs) == 2
    keys = store.all_keys
    async_totals = await store.read(app_totals(keys, ["gpu"]))
    sync_totals = run_sync(sync_client, app_totals(keys, ["gpu"]))
    assert async_totals == sync_totals
    state = async_totals.lanes[0]["gpu"]
    assert (state.capacity, state.in_flight, state.waiting) == (4, {"standard": 2}, {"standard": 4})
    assert await store.lane_state("gpu") == state
    ages = await store.read(oldest_waiting(keys, async_totals.lanes, 8))
    # the clock moves between the reads: the same classes, each read from a queue head
    assert ages.keys() == run_sync(sync_client, oldest_waiting(keys, sync_totals.lanes, 8)).keys()
    assert ages[("gpu", "standard")] >= 0.0
    assert await store.view(running_slots, 100) == {
        ("gpu", "standard", "tenant0"): 1,
        ("gpu", "standard", "tenant1"): 1,
    }
    workers = run_sync(sync_client, live_workers(store.keys, 60.0))
    assert [name for name, _ in workers] == ["w1"]
    found = await store.view(candidates, Filter(states=frozenset({"running"})), {}, [])
    assert set(found.ids) == {job.id for job in fetched.jobs}


@pytest.mark.anyio
@pytest.mark.contract
async def test_records_exist_and_a_subscription_to_finished_jobs(store: Store) -> None:
    await store.enqueue("gpu", [_job(1)])
    assert await store.records_exist(["v001", "nope"]) == [True, False]
    assert await store.records_exist([]) == []
    pubsub = await store.subscribe(store.keys.done_channel)
    try:
        await store.client.publish(store.keys.done_channel, b"v001")
        message = None
        for _ in range(50):  # the confirmation is not handed out: the first is ours
            message = await pubsub.get_message(timeout=0.1)
            if message is not None:
                break
        assert message is not None and message["data"] == b"v001"
    finally:
        await pubsub.aclose()


def _keyed(job_id: str, tenant: str) -> NewJob:
    return NewJob(
        job_id, tenant, 0, "views.job", "[]", 1, "", 0, "0,0", "0,0", limits=[("model", 1)]
    )


@pytest.mark.anyio
async def test_a_woken_job_is_an_offer_on_its_key_and_queued_again(store: Store) -> None:
    await store.enqueue("gpu", [_keyed("k1", "acme"), _keyed("k2", "beta")])
    got = await store.exchange("w1", ["gpu"], 2, 60_000, slots=4)
    assert [j.id for j in got.jobs] == ["k1"]  # k2 parks on the key
    (view,) = await store.view(throttles, 100)
    assert (view.in_use, view.offers, view.jobs, view.waiters) == (1, 0, 2, ["k2"])
    await store.exchange("w1", ["gpu"], 0, 60_000, [Outcome("k1", got.jobs[0].token, "ok")])
    # k1's release woke k2: no slot held, one offered, nobody waiting
    (view,) = await store.view(throttles, 100)
    assert (view.limit, view.in_use, view.offers, view.jobs, view.waiters) == (1, 0, 1, 1, [])
    # and the woken job is found where it waits: its tenant's queue
    found = await store.view(
        candidates, Filter(states=frozenset({"queued"})), {"gpu": ["standard"]}, []
    )
    assert set(found.ids) == {"k2"}
