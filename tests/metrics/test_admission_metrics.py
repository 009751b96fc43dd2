"""Store-side metrics against a real server: admission decisions counted by the server
by lane, class, outcome and reason, and the age of the oldest waiting job per class."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from fairlane import App, Rejected
from fairlane.config.pools import parse_config
from fairlane.policy.admission.reasons import COUNTED_REASONS
from fairlane.store.views.totals import split_stats as _split_stats
from tests.e2e.helpers import WAIT, eventually, fast_settings, running_worker
from tests.metrics.helpers import scrape_store, series, store_reader, value

pytestmark = pytest.mark.anyio

LANE = "default"
DECISIONS = "fairlane_admission_decisions_total"
OLDEST = "fairlane_queue_oldest_age_seconds"

# gold refuses when full and bounds each tenant to two admitted jobs; std defers once
# three of its jobs are admitted
CONFIG: dict[str, Any] = {
    "pools": {
        LANE: {
            "capacity_units": 10,
            "classes": {
                "gold": {
                    "nominal_share": 0.5,
                    "max_queue": 100,
                    "tenant_max_queue": 2,
                    "response_when_full": "reject",
                },
                "std": {
                    "nominal_share": 0.5,
                    "max_queue": 3,
                    "max_deferred": 10,
                    "response_when_full": "defer",
                },
            },
        }
    },
    "estimation": {"safety_multiplier": 1.0},
}


def admission_app(namespace: str, redis_url: str) -> App:
    return App(
        namespace, redis_url=redis_url, settings=fast_settings(), config=parse_config(CONFIG)
    )


async def test_decisions_are_counted_by_outcome_and_reason(redis_url: str, namespace: str) -> None:
    app = admission_app(namespace, redis_url)

    @app.task(service_class="std")
    async def noop(n: int) -> int:
        return n

    async with app:
        answers = [
            *[(await noop.submit(i, tenant="a", service_class="gold"), "gold") for i in range(3)],
            *[
                (await noop.submit(i, tenant=f"s{i}", service_class="std", estimate=1.0), "std")
                for i in range(5)
            ],
            (await noop.submit(0, tenant="b", service_class="gold", estimate=500.0), "gold"),
        ]
        # a batch is decided in one call and still counted job by job
        batch = await noop.enqueue_many([(i,) for i in range(2)], tenant="c", service_class="std")
        reader = store_reader(app, redis_url)
        try:
            s = await scrape_store(reader)
        finally:
            reader.close()
        stats = await app.stats()

    told = Counter((cls, a.status, a.reason or "none") for a, cls in answers)
    told[("std", "deferred", "class_queue_full")] += len(batch)
    # the cases the configuration is built to produce, each with its reason
    assert told[("gold", "accepted", "none")] == 2
    assert told[("gold", "rejected", "tenant_queue_full")] == 1
    assert told[("gold", "rejected", "too_wide")] == 1
    assert told[("std", "accepted", "none")] == 3
    assert told[("std", "deferred", "class_queue_full")] == 4
    # the server's counters say exactly what the callers were told
    counted = {
        (labels["class"], labels["outcome"], labels["reason"]): n
        for labels, n in s[DECISIONS]
        if labels["lane"] == LANE
    }
    assert counted == dict(told)
    assert value(s, DECISIONS, outcome="rejected") == 2
    # the older counters keep their meaning, and the decision fields stay out of them
    assert stats["rejected"] == 2 and stats["deferred"] == 4
    assert value(s, "fairlane_store_events_total", event="rejected") == 2
    assert not [got for got, _ in s["fairlane_store_events_total"] if ":" in got["event"]]


async def test_lanes_without_admission_count_no_decisions(redis_url: str, namespace: str) -> None:
    app = App(namespace, redis_url=redis_url, settings=fast_settings())

    @app.task(lane="plain")
    async def noop(n: int) -> int:
        return n

    async with app:
        await noop.enqueue(1)
        stats = await app.stats()
    assert not [name for name in stats if name.startswith("adm:")]


async def test_a_lane_without_a_pool_counts_its_default_bounds_refusals_with_their_reason(
    redis_url: str, namespace: str
) -> None:
    settings = fast_settings(queues={"tenant_max_queued": 2, "lane_max_queued": 3})
    app = App(namespace, redis_url=redis_url, settings=settings)

    @app.task(lane="plain")
    async def noop(n: int) -> int:
        return n

    async with app:
        await noop.enqueue_many([(1,), (2,)], tenant="a")
        refused = [(await noop.submit(3, tenant="a")).reason]
        with pytest.raises(Rejected) as lane_full:  # a batch reads the lane's count
            await noop.enqueue_many([(4,), (5,)], tenant="b")
        refused.append(lane_full.value.reason)
        reader = store_reader(app, redis_url)
        try:
            s = await scrape_store(reader)
        finally:
            reader.close()
    assert refused == ["tenant_queue_full", "lane_queue_full"]
    counted = {
        (labels["outcome"], labels["reason"]): n
        for labels, n in s[DECISIONS]
        if labels["lane"] == "plain"
    }
    # the refusals with their reasons; the accepted jobs of a plain lane are not counted
    # judged job by job: the batch's first job fit, its second did not
    assert counted == {("rejected", "tenant_queue_full"): 1, ("rejected", "lane_queue_full"): 1}
    assert {labels["reason"] for labels, _ in s[DECISIONS]} <= set(COUNTED_REASONS)


async def test_oldest_waiting_job_age_grows_then_clears(redis_url: str, namespace: str) -> None:
    app = App(namespace, redis_url=redis_url, settings=fast_settings())

    @app.task(lane="slow")
    async def noop(n: int) -> int:
        return n

    reader = store_reader(app, redis_url)
    capped = store_reader(app, redis_url, oldest_tenants=1)
    try:
        async with app:
            first = await noop.enqueue(0, tenant="early")
            await asyncio.sleep(0.4)
            later = [await noop.enqueue(i, tenant=f"t{i}") for i in range(3)]
            # a job scheduled for later is not waiting yet
            await noop.enqueue(9, tenant="early", delay=600)
            where = {"lane": "slow", "class": "standard"}
            s = await scrape_store(reader)
            age = value(s, OLDEST, **where)
            assert 0.4 <= age < WAIT
            await asyncio.sleep(0.3)
            grown = value(await scrape_store(reader), OLDEST, **where)
            assert grown >= age + 0.25
            # capped to one tenant per class, the value is a lower bound
            assert 0 < value(await scrape_store(capped), OLDEST, **where) <= grown + 0.1
            async with running_worker(app, lanes=["slow"]):
                for job in [first, *later]:
                    await job.result(timeout=WAIT)

                async def cleared() -> bool:
                    samples = await scrape_store(reader)
                    return (
                        series(samples, OLDEST).get((("class", "standard"), ("lane", "slow")), 0)
                        == 0
                    )

                await eventually(cleared)
    finally:
        reader.close()
        capped.close()


def test_decision_fields_are_split_from_the_other_counters() -> None:
    stats, decisions = _split_stats(
        {
            "fifo": 9,
            "completed": 3,
            "adm:accepted:none:light:standard": 5,
            "adm:rejected:class_full:light:batch": 2,
            "adm:malformed": 1,  # not four parts: ignored rather than mislabelled
        }
    )
    assert stats == {"completed": 3}
    assert decisions == {
        ("light", "standard", "accepted", "none"): 5,
        ("light", "batch", "rejected", "class_full"): 2,
    }
