"""The slots a lane needs, read from a real server: the deadline index the scripts keep
(enqueue adds a job with a deadline, its finish takes it out), the figures a scrape
gives against the rule (``fairlane.policy.capacityneed``) on the same inputs and on a
hand-worked case, and the read's bound. No worker serves the lanes, so the queues hold
still."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fairlane.gateway import create_app
from fairlane.metrics import StoreCollector, StoreReader
from fairlane.metrics.needs import lane_need
from fairlane.metrics.store import StoreSnapshot, autoscale_view
from fairlane.policy.capacityneed import deadline_need
from fairlane.store.api import Store
from fairlane.store.durations import class_field, task_field, tenant_field
from fairlane.store.reads import Plan, run_async
from fairlane.store.views.lanes import lane_states_by_shard
from fairlane.store.views.needs import LaneNeeds, lane_needs
from fairlane.store.wire import NewJob, Outcome
from tests.gateway.helpers import build_app
from tests.metrics.helpers import parse, value
from tests.metrics.test_gateway_metrics import client

pytestmark = pytest.mark.anyio


def _job(
    job_id: str, tenant: str, *, deadline_ms: int | None = None, slots: int = 1, task: str = "w"
) -> NewJob:
    deadline = "" if deadline_ms is None else str(deadline_ms)
    return NewJob(
        job_id, tenant, 0, task, "[]", 1, "", 0, "-1,-1", "-1,-1",
        deadline=deadline, slots=slots,
    )  # fmt: skip


def _index(store: Store, lane: str) -> str:
    return store.keys.lane_deadlines(lane)


async def test_the_index_holds_the_unfinished_jobs_with_a_deadline_only(store: Store) -> None:
    now = await store.server_time_ms()
    jobs = [_job(f"d{n}", "t", deadline_ms=now + 60_000 + n) for n in range(3)]
    jobs += [_job(f"p{n}", "t") for n in range(2)]
    await store.enqueue("a", jobs)
    assert await store.client.zrange(_index(store, "a"), 0, -1) == [b"d0", b"d1", b"d2"]
    got = await store.exchange("w", ["a"], 1, 60_000, slots=1)  # d0, first in
    assert [j.id for j in got.jobs] == ["d0"]
    # running is still unfinished; its end takes it out, as a cancel does
    assert await store.client.zcard(_index(store, "a")) == 3
    await store.ack(["a"], [Outcome("d0", got.jobs[0].token, "ok", "1")], "w")
    assert await store.cancel("d1") == "cancelled"
    assert await store.client.zrange(_index(store, "a"), 0, -1) == [b"d2"]


async def _hand_case(store: Store) -> int:
    """The policy test's case: A (4 s, due in 11), B (10 s on 2 slots, due in 22.5), C
    (28 s, due in 37), D (8 s, due in 5: too late); 50 more jobs of tenant bulk, no
    deadline, 6 slot-s each learned; the class's mean 2 slot-s."""
    now = await store.server_time_ms()
    # each deadline a quarter of the job's length later than the policy test's finish-by
    spec = {"A": (11, 4, 1), "B": (22.5, 10, 2), "C": (37, 28, 1), "D": (5, 8, 1)}
    learned = [
        (class_field("a", "standard"), 1, 2_000.0),
        (tenant_field("a", "standard", "bulk"), 1, 6_000.0),
    ]
    jobs = []
    for name, (left, length, width) in spec.items():
        learned.append((task_field(f"task{name}", f"t{name}"), 1, length * 1000.0))
        jobs.append(
            _job(name, f"t{name}", deadline_ms=now + left * 1000, slots=width, task=f"task{name}")
        )
    jobs += [_job(f"bulk{n}", "bulk") for n in range(50)]
    await store.learn_durations(learned)
    await store.enqueue("a", jobs)
    return now


async def _read(store: Store, deadlines: int = 1000, tenants: int = 64) -> LaneNeeds:
    states = await run_async(store.client, lane_states_by_shard([store.keys], ["a"]))
    plan = lane_needs([store.keys], states, {"a": frozenset({"batch"})}, deadlines, tenants)
    return (await run_async(store.client, plan))["a"]


async def test_a_scrape_gives_the_rule_on_what_it_read(store: Store) -> None:
    await _hand_case(store)
    found = await _read(store)
    jobs = [j for _, j in found.deadlines]  # by deadline, as the index holds them
    # what was read: each job's learned length and width, its time left a moment less
    assert [(j.length_s, j.slots) for j in jobs] == [(8, 1), (4, 1), (10, 2), (28, 1)]
    assert [round(j.left_s) for j in jobs] == [5, 11, 22, 37]
    assert all(j.left_s <= left for j, left in zip(jobs, [5, 11, 22.5, 37], strict=True))
    assert found.unread == 0
    state_of = await run_async(store.client, lane_states_by_shard([store.keys], ["a"]))
    need = lane_need(
        "a", state_of[0]["a"], found=found, batch=frozenset(), held={}, horizon_s=100.0
    )
    assert need.deadlines == deadline_need(jobs)
    # the hand-worked figure: 42 slot-s due by t=20, 3 slots; D counted apart
    assert need.deadlines.exact == pytest.approx(2.1, rel=0.01)
    assert (need.deadlines.slots, need.deadlines.jobs, need.deadlines.unmeetable) == (3, 3, 1)
    # 50 x 6 slot-s of bulk and 4 deadline jobs at the class's 2: 308 over 100 s
    assert need.horizon.work_s == pytest.approx(308.0)
    assert (need.horizon.slots, need.slots) == (4, 4)


async def test_the_reader_exports_the_needs_and_autoscale_shows_them(
    store: Store, redis_url: str, namespace: str
) -> None:
    await _hand_case(store)
    reader = StoreReader(redis_url, namespace, ["a"], max_age=0.0, horizon=100.0)
    try:
        snap = reader.snapshot()
        assert snap is not None
        registry = CollectorRegistry()
        registry.register(StoreCollector(reader))
        samples = parse(generate_latest(registry).decode())
    finally:
        reader.close()
    lane: dict[str, Any] = autoscale_view(snap)["lanes"]["a"]
    assert lane["backlog_total"] == 55  # unchanged beside the new fields
    assert {k: lane[k] for k in lane if k.startswith(("slots_needed", "deadlines_"))} == {
        "slots_needed": 4,
        "slots_needed_deadlines": 3,
        "slots_needed_horizon": 4,
        "deadlines_waiting": 3,
        "deadlines_unmeetable": 1,
        "deadlines_unread": 0,
    }
    assert lane["horizon_seconds"] == 100.0
    assert value(samples, "fairlane_lane_slots_needed", lane="a", **{"for": "deadlines"}) == 3
    assert value(samples, "fairlane_lane_slots_needed", lane="a", **{"for": "horizon"}) == 4
    assert value(samples, "fairlane_deadlines_unmeetable", lane="a") == 1


def _counted(plan: Plan[Any], sizes: list[int]) -> Plan[Any]:
    """``plan``, noting how many commands each of its round trips sends."""
    step = next(plan)
    while True:
        sizes.append(len(step))
        replies = yield step
        try:
            step = plan.send(replies)
        except StopIteration as done:
            return done.value


async def test_the_read_is_bounded_and_says_what_it_left(store: Store) -> None:
    now = await store.server_time_ms()
    await store.enqueue(
        "a", [_job(f"j{n:02d}", f"t{n % 12}", deadline_ms=now + 60_000 + n) for n in range(40)]
    )
    states = await run_async(store.client, lane_states_by_shard([store.keys], ["a"]))
    sizes: list[int] = []
    plan = _counted(lane_needs([store.keys], states, {"a": frozenset()}, 10, 4), sizes)
    found = (await run_async(store.client, plan))["a"]
    # the 10 due soonest, 30 left; 4 of the 12 tenants' queues, the rest at the class mean
    assert len(found.deadlines) == 10 and found.unread == 30
    assert sorted(round(j.left_s) for _, j in found.deadlines)[-1] == 60
    assert len(found.queued["standard"]) == 4 + 1
    # lanes * (2 + 2 * deadlines) + classes * (2 + 2 * tenants) + 3, at most
    assert sum(sizes) <= 1 * (2 + 2 * 10) + 1 * (2 + 2 * 4) + 3
    view = autoscale_view(
        StoreSnapshot(
            {"a": states[0]["a"]},
            {},
            0,
            needs={
                "a": lane_need(
                    "a", states[0]["a"], found=found, batch=frozenset(), held={}, horizon_s=300.0
                )
            },
        )
    )
    assert view["lanes"]["a"]["deadlines_unread"] == 30
    # nothing learned: every deadline job may need its slot until its deadline
    assert view["lanes"]["a"]["slots_needed_deadlines"] == 10


async def test_a_paused_class_asks_for_nothing(store: Store) -> None:
    await _hand_case(store)
    found = await _read(store)
    states = await run_async(store.client, lane_states_by_shard([store.keys], ["a"]))
    state = states[0]["a"]
    held = {("a", "standard"): state.waiting["standard"]}
    need = lane_need("a", state, found=found, batch=frozenset(), held=held, horizon_s=100.0)
    assert (need.deadlines.slots, need.horizon.slots, need.slots) == (0, 0, 0)
    assert need.deadlines.jobs == 0


async def test_the_gateway_takes_the_apps_horizon(redis_url: str, namespace: str) -> None:
    app = build_app(namespace, redis_url, autoscale_horizon=60.0)

    @app.task(gateway=True, name="report", lane="quiet")
    async def report() -> None:
        return None

    async with app:
        await report.enqueue(tenant="t", deadline=600.0)
        api = create_app(app)
        async with client(api) as c:
            r = await c.get("/autoscale")
    quiet = r.json()["lanes"]["quiet"]
    assert quiet["horizon_seconds"] == 60.0
    # nothing learned: the one job asks for its slot, for its deadline and its backlog
    assert (quiet["slots_needed"], quiet["deadlines_waiting"], quiet["backlog_total"]) == (1, 1, 1)
