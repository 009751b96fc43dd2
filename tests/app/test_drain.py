"""``App.drain``: every waiting job a filter matches ends cancelled, and nothing else does.

On a real server: a tenant's few thousand jobs drained while another's stay (its queue
bound has room again, the lane's counts are the other tenant's), each filter alone, a
dry run that changes nothing, a drain cut off and run again, every shard of a sharded
app, the audit trail's entries, and the input it refuses before changing anything.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from fairlane import App
from fairlane.app.drain import DrainProgress, _Walk
from fairlane.errors import UnknownTask
from fairlane.policy.classes import ClassTable, ServiceClass
from tests.e2e.helpers import fast_settings

pytestmark = pytest.mark.anyio

BOUND = 2500


def make_app(namespace: str, redis_url: str, **kwargs: Any) -> App:
    table = ClassTable(
        (ServiceClass("std", nominal_share=0.5), ServiceClass("bulk", nominal_share=0.5))
    )
    app = App(
        namespace,
        redis_url=redis_url,
        settings=fast_settings(queues={"tenant_max_queued": BOUND}),
        lanes={"side": table},
        **kwargs,
    )

    @app.task(name="mail")
    async def mail(n: int) -> None:
        return None

    @app.task(name="report")
    async def report(n: int) -> None:
        return None

    @app.task(name="crunch", lane="side", service_class="bulk")
    async def crunch(n: int) -> None:
        return None

    return app


async def statuses(app: App, ids: Sequence[str]) -> Counter[str]:
    found: Counter[str] = Counter()
    for shard, shard_ids in app.sharded.by_shard(ids).items():
        store = app.stores[shard]
        pipe = store.client.pipeline(transaction=False)
        for job_id in shard_ids:
            pipe.hget(store.keys.job(job_id), "st")
        found.update((st or b"-").decode() for st in await pipe.execute())
    return found


async def test_one_tenants_jobs_are_drained_and_the_others_stay(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)
    mail = app.tasks["mail"]
    async with app:
        others = await mail.enqueue_many([(i,) for i in range(200)], tenant="b")
        before = await app.store.lane_state("default")
        ids: list[str] = []
        for start in range(0, BOUND, 500):
            jobs = await mail.enqueue_many([(i,) for i in range(start, start + 500)], tenant="a")
            ids.extend(job.id for job in jobs)
        refused = await mail.submit(0, tenant="a")
        assert refused.reason == "tenant_queue_full"

        counted = await app.drain(tenant="a", dry_run=True)
        assert (counted.matched, counted.cancelled, counted.dry_run) == (BOUND, 0, True)
        assert await statuses(app, ids) == {"queued": BOUND}

        told: list[DrainProgress] = []
        report = await app.drain(tenant="a", progress=told.append, actor="test")
        assert report.cancelled == BOUND and report.calls == len(told) > 2
        # by the script's own clock, where the server gives it one (not Redis 7.0)
        assert report.longest_call_us > 0 or {p.call_us for p in told} == {-1}
        assert [p.matched for p in told] == sorted(p.matched for p in told)
        assert told[-1].matched == BOUND and told[-1].source == told[-1].sources
        assert await statuses(app, ids) == {"cancelled": BOUND}
        assert await statuses(app, [j.id for j in others]) == {"queued": 200}
        assert await app.store.lane_state("default") == before
        assert (await mail.submit(0, tenant="a")).status == "accepted"
        # written to the audit trail, when it started and when it ended
        done, started = await app.store.key_records.audit.read(10, action="drain")
        assert (started.outcome, done.outcome) == ("started", "done")
        assert done.key_id == "test" and done.tenant == "a"
        assert done.detail.startswith(f"cancelled={BOUND} ") and "tenant=a" in done.detail


async def test_each_filter_takes_its_own_jobs(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    mail, report, crunch = (app.tasks[n] for n in ("mail", "report", "crunch"))
    async with app:
        old = await mail.enqueue_many([(i,) for i in range(30)], tenant="t")
        cut = await app.store.server_time_ms() + 1
        while await app.store.server_time_ms() <= cut:
            pass
        kinds = {
            "old": old,
            "keyed": await mail.enqueue_many(
                [(i,) for i in range(20)], tenant="t", fairness_key="u1"
            ),
            "report": await report.enqueue_many([(i,) for i in range(15)], tenant="t"),
            "side": await crunch.enqueue_many([(i,) for i in range(10)], tenant="t"),
            "later": await mail.enqueue_many([(i,) for i in range(5)], tenant="t", delay=600),
        }
        ids = {kind: [j.id for j in jobs] for kind, jobs in kinds.items()}
        every = [i for kind in ids.values() for i in kind]
        cases: list[tuple[dict[str, Any], str]] = [
            ({"enqueued_before": cut / 1000}, "old"),
            ({"fairness_key": "u1"}, "keyed"),
            ({"task": report}, "report"),
            ({"lane": "side", "service_class": "bulk"}, "side"),
            (
                {"state": "scheduled", "enqueued_after": datetime.fromtimestamp(cut / 1000, UTC)},
                "later",
            ),
        ]
        for flt, kind in cases:
            assert (await app.drain(dry_run=True, **flt)).matched == len(ids[kind]), flt
        assert await statuses(app, every) == {"queued": 75, "scheduled": 5}
        for flt, kind in cases:
            assert (await app.drain(**flt)).cancelled == len(ids[kind]), flt
            assert await statuses(app, ids[kind]) == {"cancelled": len(ids[kind])}
        assert await statuses(app, every) == {"cancelled": 80}
        assert (await app.drain(tenant="nobody")).cancelled == 0


async def test_a_drain_cut_off_is_finished_by_running_it_again(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)
    mail = app.tasks["mail"]

    class Stop(Exception):
        pass

    def stop_at_first_cancel(progress: DrainProgress) -> None:
        if progress.matched:
            raise Stop

    async with app:
        jobs = await mail.enqueue_many([(i,) for i in range(2000)], tenant="a")
        with pytest.raises(Stop):
            await app.drain(tenant="a", progress=stop_at_first_cancel)
        left = (await statuses(app, [j.id for j in jobs]))["queued"]
        assert 0 < left < 2000
        assert (await app.drain(tenant="a")).cancelled == left
        assert await statuses(app, [j.id for j in jobs]) == {"cancelled": 2000}


async def test_a_drain_without_a_tenant_takes_every_shard(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url, shards=3)
    mail, report = app.tasks["mail"], app.tasks["report"]
    async with app:
        names = [f"t{i}" for i in range(60)]
        tenants = [[t for t in names if app.shard_of(t) == s][:3] for s in range(3)]
        tenants = [t for shard in tenants for t in shard]
        assert len(tenants) == 9
        mailed = [j.id for t in tenants for j in await mail.enqueue_many([(1,), (2,)], tenant=t)]
        kept = [j.id for t in tenants for j in await report.enqueue_many([(1,)], tenant=t)]
        report_of = await app.drain(task="mail")
        assert (report_of.cancelled, report_of.shards) == (18, 3)
        assert await statuses(app, mailed) == {"cancelled": 18}
        assert await statuses(app, kept) == {"queued": 9}
        one = await app.drain(tenant=tenants[0], dry_run=True)
        assert (one.matched, one.shards) == (1, 1)


async def test_input_the_app_does_not_have_changes_nothing(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    async with app:
        jobs = await app.tasks["mail"].enqueue_many([(i,) for i in range(10)], tenant="a")
        with pytest.raises(UnknownTask, match="nope"):
            await app.drain(task="nope")
        refused = [
            ({"lane": "nope"}, "no lane 'nope'"),
            ({"service_class": "nope"}, "no class 'nope'"),
            ({"lane": "side", "service_class": "standard"}, "no class 'standard' in lane 'side'"),
            ({"state": "running"}, "waiting jobs only"),
            ({"state": ["queued", "done"]}, "no waiting state 'done'"),
            ({"enqueued_after": 20.0, "enqueued_before": 10.0}, "no job is both"),
            ({"tenant": ""}, "tenant is a name"),
        ]
        for flt, message in refused:
            with pytest.raises(ValueError, match=message):
                await app.drain(**flt)
        assert await statuses(app, [j.id for j in jobs]) == {"queued": 10}
        assert await app.store.key_records.audit.read(10, action="drain") == []


def test_a_call_over_its_budget_shrinks_the_next_and_one_under_lets_it_grow_back() -> None:
    walk = _Walk(dry_run=False, progress=None, budget_us=1000, pause=0.0)
    assert walk.next_budget(1000, 2000) == 500  # its effects doubled it: half the next
    assert walk.next_budget(500, 1000) == 500  # on target
    assert walk.next_budget(500, 250) == 1000  # under: back up, never past budget_us
    assert walk.next_budget(1000, 50_000) == 100  # never below a tenth
    assert walk.next_budget(700, 0) == 700  # a call that reports nothing changes nothing
