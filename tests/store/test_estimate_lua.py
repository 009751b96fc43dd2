"""The store's side of start-time estimates (``lua/estimate.lua``) against its twins in
``fairlane.policy.startpredict``: learned means folded as ``fold_mean`` folds them,
dispatch's deadline check deciding as ``unmeetable`` decides, and the one read an
estimate takes giving the rule what the store holds."""

from __future__ import annotations

import random

import pytest

from fairlane.policy.deadlineorder import DEADLINE_SPAN
from fairlane.policy.fairkeys import ORDER_SPAN, order_score
from fairlane.policy.startpredict import fold_mean, needs_at_enqueue, unmeetable
from fairlane.store.api import Store
from fairlane.store.durations import (
    charge_field,
    class_field,
    stored_at,
    task_field,
    tenant_field,
)
from fairlane.store.wire import NewJob, Outcome, Reply

pytestmark = [pytest.mark.anyio, pytest.mark.contract]

LANES = ["a"]


def _job(
    tenant: str, n: int, *, task: str = "w.job", deadline: str = "", needs_ms: int = 0
) -> NewJob:
    return NewJob(
        f"{tenant}-{n:03d}", tenant, 0, task, "[]", 1, "", 0, "-1,-1", "-1,-1",
        deadline=deadline, needs_ms=needs_ms,
    )  # fmt: skip


async def test_learned_means_fold_as_the_policy_folds(store: Store) -> None:
    rng = random.Random(31)
    for case in range(40):
        field = task_field("w.job", f"t{case}")
        expected: float | None = None
        for _ in range(rng.randint(1, 6)):
            count, mean = rng.randint(1, 30), rng.uniform(0, 50_000)
            await store.learn_durations([(field, count, mean * count)])
            expected = fold_mean(expected, count, mean)
            stored = float(await store.client.hget(*stored_at(store.keys, field)))
            assert stored == pytest.approx(expected, rel=1e-6, abs=2e-3)


async def test_one_call_of_many_entries_folds_each_in_turn(store: Store) -> None:
    """A call holding several fields of one tenant's key, fields of the shared key and the
    same field more than once: each mean is what folding its entries one by one, in the
    call's order, gives, and a usage field's window holds the sum of its entries' totals
    (as the worker sends them: what it gathered since its last call, in one)."""
    rng = random.Random(47)
    expected: dict[str, float | None] = {}
    windows: dict[str, tuple[str, float]] = {}  # usage field: its window, the sum there
    for _ in range(8):
        fields = [
            *(tenant_field("a", "standard", f"t{i}") for i in range(3)),
            *(charge_field("a", "standard", f"t{i}") for i in range(3)),
            *(task_field("w.job", f"t{i}") for i in range(3)),
            class_field("a", "standard"),
            task_field("w.job"),
        ]
        entries, used = [], {}
        for field in rng.choices(fields, k=14):  # some fields twice or more
            count, mean = rng.randint(1, 30), rng.uniform(0, 50_000)
            entries.append((field, count, mean * count))
            expected[field] = fold_mean(expected.get(field), count, mean)
            used[field] = used.get(field, 0.0) + mean * count
        assert await store.learn_durations(entries) == len(entries)
        for field, mean in expected.items():
            stored = float(await store.client.hget(*stored_at(store.keys, field)))
            assert stored == pytest.approx(mean, rel=1e-6, abs=2e-3)
        for field, this_call in used.items():
            use = {"t": "w", "c": "uc"}.get(field[0])
            if use is None:
                continue
            key, name = stored_at(store.keys, field)
            window, window_sum = (
                (await store.client.hget(key, use + name[1:])).decode().split("|")[:2]
            )
            before = windows.get(field)
            total = this_call + (before[1] if before is not None and before[0] == window else 0)
            windows[field] = (window, total)
            assert float(window_sum) == pytest.approx(total, abs=2e-3 * len(entries))


async def test_dispatch_expires_what_cannot_finish_as_the_policy_decides(store: Store) -> None:
    """Each job's deadline and learned length straddle the check; whether dispatch expired
    it or leased it must be what ``unmeetable`` says at the time dispatch recorded (its
    start, or its end as expired)."""
    rng = random.Random(5)
    now = await store.server_time_ms()
    jobs, lengths = [], {}
    for n in range(60):
        tenant = f"t{n}"
        left = rng.randint(2_000, 60_000)
        learned = rng.choice([None, float(rng.randint(0, 90_000))])
        if learned is not None:
            await store.learn_durations([(task_field("w.job", tenant), 1, learned)])
        lengths[f"{tenant}-000"] = (now + left, learned)
        jobs.append(_job(tenant, 0, deadline=str(now + left)))
    await store.enqueue("a", jobs)
    got = await store.exchange("w", LANES, 100, 60_000, slots=100)
    await store.ack(LANES, [Outcome(j.id, j.token, "ok", "1") for j in got.jobs], "w")
    leased = {j.id for j in got.jobs}
    expired = 0
    for job_id, (deadline, learned) in lengths.items():
        rec = await store.read_job(job_id)
        assert rec is not None
        at = rec.started_ms if job_id in leased else rec.finished_ms
        assert at is not None
        assert unmeetable(at, deadline, learned) == (job_id not in leased), job_id
        expired += job_id not in leased
        if job_id not in leased:
            assert rec.status == "expired" and rec.attempts == 0
    assert 0 < expired < len(lengths)  # the draw straddles the check


async def test_enqueue_refuses_a_job_whose_expected_end_is_past_its_deadline(
    store: Store,
) -> None:
    now = await store.server_time_ms()
    replies = await store.enqueue(
        "a",
        [
            _job("x", 1, deadline=str(now + 10_000), needs_ms=20_000),
            _job("x", 2, deadline=str(now + 10_000), needs_ms=5_000),
            _job("x", 3, deadline=str(now + 10_000)),  # not estimated: taken
        ],
    )
    assert [code for _, code in replies] == [Reply.DEADLINE_UNMEETABLE, 1, 1]
    assert await store.read_job("x-001") is None


async def test_the_estimate_read_gives_the_rule_what_the_store_holds(store: Store) -> None:
    await store.client.hset(store.keys.weights, "b", "2")
    await store.enqueue("a", [_job("a", n) for n in range(5)] + [_job("b", n) for n in range(3)])
    await store.learn_durations(
        [
            (tenant_field("a", "standard", "a"), 1, 400.0),
            (class_field("a", "standard"), 1, 300.0),
            (task_field("w.job", "b"), 1, 250.0),
        ]
    )
    est = await store.estimate_job("a-003")
    assert est.state == "queued" and est.tenant == "a" and est.cls == "standard"
    sit = est.situation
    assert sit is not None and sit.ahead == 3
    by = {b.tenant: b for b in sit.backlogs}
    assert by["a"].jobs == 5 and by["a"].weight == 1 and by["a"].slot_seconds == 0.4
    assert by["b"].jobs == 3 and by["b"].weight == 2 and by["b"].slot_seconds == 0
    assert sit.class_slot_seconds == 0.3 and sit.unread == 0
    new = await store.estimate_new(tenant="b", lane="a", cls="standard", task="w.job")
    assert new.state == "new" and new.situation is not None and new.situation.ahead == 3
    assert new.own_ms == 250
    # a job of a higher priority is placed behind those of its priority only
    urgent = NewJob("a-hi", "a", 5, "w.job", "[]", 1, "", 0, "-1,-1", "-1,-1")
    await store.enqueue("a", [urgent])
    place = order_score(5, ORDER_SPAN - DEADLINE_SPAN)
    placed = await store.estimate_new(
        tenant="a", lane="a", cls="standard", task="w.job", before=place
    )
    assert placed.situation is not None and placed.situation.ahead == 1
    capped = await store.estimate_job("a-003", max_tenants=1)
    assert capped.situation is not None and capped.situation.unread == 1
    assert (await store.estimate_job("nope")).state == ""


async def test_enqueue_counts_what_its_tenant_queued_since_the_estimate(store: Store) -> None:
    """A burst's estimates race: each saw the queue as it was; enqueue adds what came since,
    as ``needs_at_enqueue`` says."""
    await store.enqueue("a", [_job("x", n) for n in range(3)])
    now = await store.server_time_ms()
    deadline = now + 10_000
    for n, per_job in ((10, 1_500), (11, 1_000)):
        job = _job("x", n, deadline=str(deadline), needs_ms=6_000)
        job.needs_seen, job.needs_per_job_ms = 0, per_job
        [(_, code)] = await store.enqueue("a", [job])
        # the first is refused (10,500 ms > 10,000), so the queue stays at 3 for the second
        late = now + needs_at_enqueue(6_000, 0, 3, per_job) > deadline
        assert (code == Reply.DEADLINE_UNMEETABLE) == late, (per_job, code)
