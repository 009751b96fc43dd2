"""Rate keys' metrics (``fairlane.metrics.rates``): the families made of the read model,
their ``key`` label bounded to the top N keys and ``other``, and a scrape of a real
store whose rate keys were written by real workers running real jobs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

import fairlane
from fairlane import Estimate, Throttled
from fairlane.metrics import MetricsConfig
from fairlane.metrics.rates import labelled_keys, rate_families
from fairlane.metrics.tenants import OTHER
from fairlane.policy.rates import Adaptive, Rate
from fairlane.store.views.rates import RateKeys, RateKeyView
from tests.e2e.helpers import WAIT, make_app, running_worker
from tests.metrics.helpers import Samples, parse, scrape_store, series, store_reader, value


def _view(key: str, taken: float, **fields: Any) -> RateKeyView:
    base = RateKeyView(key, 10_000, Rate(2, per=1.0), 1.5, taken=taken)
    return replace(base, **fields)


class _Families(Collector):
    def __init__(self, rates: RateKeys, top_n: int) -> None:
        self.rates, self.top_n = rates, top_n

    def collect(self) -> Iterator[Metric]:
        return rate_families(self.rates, self.top_n)


def scrape(rates: RateKeys, top_n: int) -> Samples:
    registry = CollectorRegistry()
    registry.register(_Families(rates, top_n))
    return parse(generate_latest(registry).decode())


def test_the_key_label_is_bounded_to_the_busiest_keys_and_other() -> None:
    rates = RateKeys(
        [
            _view("a", 30, refunded=2.0, pushbacks=1, woken=3, waited_ms=1500, waiters=2),
            _view("b", 5, refunded=1.0, debt=4.0, woken=1, waited_ms=250, waiters=1),
            _view("c", 20, pushbacks=2, waiters=4),
            _view(
                "d",
                10,
                adaptive=7.5,
                adaptive_bounds=Adaptive(40, 1),
                paused_until_ms=13_000,
                pause_cause="429",
            ),
        ],
        known=9,
    )
    assert labelled_keys(rates.keys, 2) == {"a", "c"}
    got = scrape(rates, 2)
    admitted = series(got, "fairlane_rate_tokens_admitted_total")
    assert admitted == {
        (("key", "a"),): 30.0,
        (("key", "c"),): 20.0,
        (("key", OTHER),): 15.0,  # b and d
    }
    assert value(got, "fairlane_rate_tokens_refunded_total", key=OTHER) == 1.0
    assert value(got, "fairlane_rate_tokens_debt_total", key=OTHER) == 4.0
    assert value(got, "fairlane_rate_pushbacks_total", key="c") == 2.0
    assert value(got, "fairlane_rate_wait_seconds_total", key="a") == 1.5
    assert value(got, "fairlane_rate_woken_total", key=OTHER) == 1.0
    assert value(got, "fairlane_rate_waiters", key=OTHER) == 1.0
    assert value(got, "fairlane_rate_keys") == 9.0
    # per-key gauges for the labelled keys only: no gauge sums unrelated buckets
    assert {dict(k)["key"] for k in series(got, "fairlane_rate_tokens")} == {"a", "c"}
    assert value(got, "fairlane_rate_limit_per_second", key="a") == 2.0
    assert "fairlane_adaptive_limit" not in got or not series(got, "fairlane_adaptive_limit")
    # with room for every key, each has its own label and there is no other
    every = scrape(rates, 10)
    labels = {dict(k)["key"] for k in series(every, "fairlane_rate_tokens_admitted_total")}
    assert labels == {"a", "b", "c", "d"}
    assert value(every, "fairlane_adaptive_limit", key="d") == 7.5
    assert value(every, "fairlane_adaptive_limit_max", key="d") == 40.0
    assert value(every, "fairlane_rate_paused_seconds", key="d") == 3.0
    assert value(every, "fairlane_rate_paused_seconds", key="a") == 0.0
    # no label of its own at all: everything is other
    none = scrape(rates, 0)
    assert series(none, "fairlane_rate_tokens_admitted_total") == {(("key", OTHER),): 65.0}


def test_no_rate_key_exports_empty_families() -> None:
    got = scrape(RateKeys(), 20)
    assert value(got, "fairlane_rate_keys") == 0.0
    assert not series(got, "fairlane_rate_tokens_admitted_total")


def test_the_key_labels_bound_is_configured_and_checked() -> None:
    assert MetricsConfig().key_top_n == 20
    with pytest.raises(ValueError, match="key_top_n"):
        MetricsConfig(key_top_n=-1)


def test_the_grafana_dashboard_shows_every_rate_family() -> None:
    root = Path(__file__).resolve().parents[2]
    dashboard = (root / "deploy" / "grafana" / "fairlane.json").read_text()
    used = set(re.findall(r"fairlane_(?:rate|adaptive)_[a-z_]+", dashboard))
    exported: set[str] = set()
    for family in rate_families(RateKeys([_view("a", 1.0)]), 20):
        exported.add(family.name + ("_total" if family.type == "counter" else ""))
    assert used == exported - {"fairlane_rate_keys"}
    assert len(json.loads(dashboard)["panels"]) >= 22


# -- a real store, written by real workers ----------------------------------------------


@pytest.mark.anyio
async def test_a_scrape_counts_tokens_waits_and_a_pushback_per_key(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)
    pushed: list[int] = []

    @app.task(rates={"model:x": Rate(20, per=1.0, burst=1)})  # a token each 50 ms
    async def call(n: int) -> int:
        if n == 0 and not pushed:
            pushed.append(n)
            raise Throttled("model:x", retry_after=0.2, message="429 from the upstream")
        return n

    @app.task(limits={"model:ad": Adaptive(8, 2)})
    async def adaptive(n: int) -> int:
        return n

    async with app:
        jobs = [await call.enqueue(i, tenant="acme") for i in range(4)]
        jobs.append(await adaptive.enqueue(9, tenant="acme"))
        async with running_worker(app, concurrency=4):
            assert [await j.result(timeout=WAIT) for j in jobs] == [0, 1, 2, 3, 9]
        reader = store_reader(app, redis_url)
        try:
            got = await scrape_store(reader)
        finally:
            reader.close()
    # four jobs took a token each, and the one pushed back took one more when it ran again
    assert value(got, "fairlane_rate_tokens_admitted_total", key="model:x") == 5.0
    assert value(got, "fairlane_rate_pushbacks_total", key="model:x") == 1.0
    assert value(got, "fairlane_rate_woken_total", key="model:x") >= 3.0
    assert value(got, "fairlane_rate_wait_seconds_total", key="model:x") > 0.0
    assert value(got, "fairlane_rate_waiters", key="model:x") == 0.0
    assert value(got, "fairlane_rate_keys") >= 1.0
    # one success grew the adaptive key from its max: it stays at its max
    assert value(got, "fairlane_adaptive_limit", key="model:ad") == 8.0
    labels = series(got, "fairlane_rate_tokens_admitted_total")
    assert {dict(k)["key"] for k in labels} == {"model:x", "model:ad"}  # no other


@pytest.mark.anyio
async def test_a_units_key_counts_refunds_and_debts(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    # refilling one unit a minute: the refund and the debt are what the corrections gave
    rate = Rate(1, per=60.0, burst=50, cost="units")

    @app.task(rates={"model:u": rate})
    async def call(tokens: int) -> int:
        fairlane.context().report_usage(input_tokens=tokens)
        return tokens

    async with app:
        # declares 10 units, uses 2: 8 back; declares 0.01, uses 5: 4.99 owed (less and more
        # by the attempts' wall time)
        over = await call.enqueue(2_000, tenant="a", estimate=Estimate(input_tokens=10_000))
        async with running_worker(app, concurrency=1):
            await over.result(timeout=WAIT)
            under = await call.enqueue(5_000, tenant="b", estimate=Estimate(input_tokens=10))
            await under.result(timeout=WAIT)
        reader = store_reader(app, redis_url)
        try:
            got = await scrape_store(reader)
        finally:
            reader.close()
    admitted = value(got, "fairlane_rate_tokens_admitted_total", key="model:u")
    refunded = value(got, "fairlane_rate_tokens_refunded_total", key="model:u")
    debt = value(got, "fairlane_rate_tokens_debt_total", key="model:u")
    # each attempt's wall time is used too (0.1 unit a second): a little less back, a
    # little more owed, by as much as the worker took
    assert admitted == pytest.approx(10.01, abs=1e-9)
    assert refunded == pytest.approx(8.0, abs=0.01) and refunded <= 8.0
    assert debt == pytest.approx(4.99, abs=0.01) and debt >= 4.99 - 1e-9
    # the bucket keeps count: full, less what was taken and owed, plus what came back and
    # what refilled in between (a unit a minute: under 0.5 in this test's time)
    refilled = value(got, "fairlane_rate_tokens", key="model:u") - (50 - admitted + refunded - debt)
    assert -1e-9 <= refilled < 0.5
