"""The Redis commands each Lua library function runs inside, per no-op job: counts.

Where ``test_hot_path`` budgets a job's whole life, this budgets each entry point on its
own, so that a change that adds work shows where it did. Each phase runs alone on the
session's private server with its ``SLOWLOG`` logging every command
(``benchmarks/serverprofile.py``): a command a function runs is logged from the server's
script client (``?:0``) just before the ``FCALL`` that ran it, so each one is counted
against its function. The phases:

* ``enqueue_many``: 500 no-op jobs in one ``enqueue_many`` call (``enqueue``, one call);
* ``enqueue``: the same 500 jobs, one ``enqueue`` each (500 calls);
* ``submit``: 500 ``submit`` calls, 10 tenants in turn, on a lane with an admission pool;
* a deadline: 500 ``submit`` calls with a deadline (``estimate`` once each, then ``enqueue``);
* ``drain``: one in-process worker at concurrency 100 (``run_worker(burst=True)``) draining
  500 jobs enqueued before the phase: ``exchange`` (settling and leasing), ``ack`` (the
  last outcomes, flushed at the end) and every function the worker called in all
  (its declarations and ``leave`` included).

Leases, renewals and sweeps have intervals far longer than a run, so that ``renew`` and
``sweep`` do not run: they go by the clock, not per job. The counts do not depend on
timing: the same in every run. The same log, summed over all commands, must equal
``INFO commandstats`` for the phase, so none is missed or counted twice.

Each budget is the figure measured when it was set, plus 5 %. A change that saves work
lowers the figure: then lower the budget with it (the constants just below).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import redis.asyncio as aioredis
from benchmarks.serverprofile import METER_NAME, Attribution, SlowLog

from fairlane import App
from fairlane.config.pools import parse_config
from tests.e2e.helpers import fast_settings

pytestmark = [pytest.mark.anyio, pytest.mark.embedded_only]

# Commands run inside the function, per job, as measured on b57a712 (the same in every
# run); each budget is that figure + 5 %. Lower a figure when a change lowers the count.
# Before: 4.032, 14.072, 22.062, 6.608, 0.338, 6.976 on 2a7e7e7 (before issue 18's cuts);
# 1.034, 12.072, 20.062, 4.708, 0.238, 4.976 on da9f9fa.
ENQUEUE_MANY_BUDGET = 1.032 * 1.05  # `enqueue`, 500 jobs in one call
ENQUEUE_BUDGET = 11.072 * 1.05  # `enqueue`, one call per job
SUBMIT_BUDGET = 19.062 * 1.05  # `enqueue` through admission, one `submit` per job
EXCHANGE_BUDGET = 4.612 * 1.05  # `exchange` in the drain: settling and leasing
ACK_BUDGET = 0.228 * 1.05  # `ack` in the drain: the outcomes flushed at the end
DRAIN_BUDGET = 4.870 * 1.05  # every function the draining worker called

JOBS = 500
CONCURRENCY = 100
TENANTS = 10
#: what the profiling connection itself sends: commandstats counts it, the log not
MEASURING = frozenset({"info", "multi", "exec"})


def _settings() -> Any:
    # renewals and sweeps go by the clock: intervals longer than the run keep them out
    return fast_settings(lease={"duration": 120.0, "renew_interval": 40.0, "sweep_interval": 60.0})


def _admission() -> Any:
    return parse_config(
        {
            "pools": {
                "default": {
                    "capacity_units": 1_000_000,
                    "classes": {
                        "standard": {
                            "nominal_share": 1.0,
                            "max_queue": 1_000_000,
                            "response_when_full": "reject",
                        }
                    },
                }
            }
        }
    )


class Phase:
    """One phase under a full SLOWLOG; its commands per job, by function."""

    def __init__(self, redis_url: str) -> None:
        self.meter = aioredis.Redis.from_url(redis_url, client_name=METER_NAME)
        self.log = Attribution()

    async def __aenter__(self) -> Phase:
        self.slowlog = SlowLog(self.meter, self.log)
        await self.slowlog.__aenter__()
        await self.meter.config_resetstat()  # after the log's own probe script
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.slowlog.__aexit__(*exc)
            self.server = await _server_commands(self.meter)
        finally:
            await self.meter.aclose()

    def inside(self, function: str) -> int:
        cost = self.log.functions.get(function)
        return sum(cost.inner.values()) if cost else 0

    def calls(self, function: str) -> int:
        cost = self.log.functions.get(function)
        return cost.calls if cost else 0

    def check(self) -> None:
        """The log saw every command the server ran, and attributed each one once."""
        assert self.log.lost == 0 and self.log.orphans == 0
        assert self.log.commands() == self.server, "SLOWLOG and INFO commandstats disagree"

    def report(self, jobs: int) -> str:
        return "; ".join(
            f"{name} x{cost.calls}: {sum(cost.inner.values()) / jobs:.3f}/job "
            f"({', '.join(f'{c} {n / jobs:.2f}' for c, n in cost.inner.most_common(5))})"
            for name, cost in self.log.functions.items()
        )


async def _server_commands(meter: aioredis.Redis) -> Counter[str]:
    raw = await meter.info("commandstats")
    calls: Counter[str] = Counter()
    for key, value in raw.items():
        name = key.removeprefix("cmdstat_")
        if name not in MEASURING and not name.startswith(("config|", "slowlog|")):
            calls[name] = int(value["calls"])
    return calls


def _app(namespace: str, redis_url: str, **options: Any) -> tuple[App, Any]:
    app = App(namespace, redis_url=redis_url, settings=_settings(), **options)

    @app.task
    async def noop(i: int) -> None:
        return None

    return app, noop


STORING = {
    "enqueue_many": ENQUEUE_MANY_BUDGET,
    "enqueue": ENQUEUE_BUDGET,
    "submit": SUBMIT_BUDGET,
}


@pytest.mark.parametrize("case", STORING)
async def test_storing_a_job_runs_no_more_commands_than_its_budget(
    namespace: str, redis_url: str, case: str
) -> None:
    budget = STORING[case]
    options = {"config": _admission()} if case == "submit" else {}
    app, noop = _app(namespace, redis_url, **options)
    async with app, Phase(redis_url) as phase:
        if case == "enqueue_many":
            await noop.enqueue_many([(i,) for i in range(JOBS)])
        elif case == "enqueue":
            for i in range(JOBS):
                await noop.enqueue(i)
        else:
            for i in range(JOBS):
                admission = await noop.submit(i, tenant=f"t{i % TENANTS}")
                assert admission.admitted, admission
    phase.check()
    per_job = phase.inside("enqueue") / JOBS
    print(f"\n{case}: {phase.report(JOBS)}")
    assert phase.calls("enqueue") == (1 if case == "enqueue_many" else JOBS)
    assert set(phase.log.functions) == {"enqueue"}, phase.report(JOBS)
    assert per_job <= budget, f"{per_job:.3f} commands per job in `enqueue` ({phase.report(JOBS)})"


async def test_a_deadline_costs_a_submission_one_read_and_only_then(
    namespace: str, redis_url: str
) -> None:
    """A submission with a deadline is estimated first: one more call, a read (the
    ``estimate`` function, registered without writes); one without a deadline that does
    not ask makes none (the case above: ``enqueue`` alone)."""
    app, noop = _app(namespace, redis_url)
    async with app, Phase(redis_url) as phase:
        for i in range(JOBS):
            admission = await noop.submit(i, tenant=f"t{i % TENANTS}", deadline=3600.0)
            assert admission.admitted, admission
    phase.check()
    assert set(phase.log.functions) == {"enqueue", "estimate"}, phase.report(JOBS)
    assert phase.calls("estimate") == JOBS and phase.calls("enqueue") == JOBS


async def test_draining_runs_no_more_commands_than_its_budget(
    namespace: str, redis_url: str
) -> None:
    app, noop = _app(namespace, redis_url)
    async with app:
        await noop.enqueue_many([(i,) for i in range(JOBS)])
        async with Phase(redis_url) as phase:
            await app.run_worker(concurrency=CONCURRENCY, burst=True)
        assert (await app.stats()).get("completed", 0) == JOBS
    phase.check()
    report = phase.report(JOBS)
    everything = sum(phase.inside(f) for f in phase.log.functions) / JOBS
    print(f"\ndrain: {everything:.3f}/job in all; {report}")
    # the lease loop renews once as it starts (nothing to renew yet), then not again
    assert phase.calls("renew") <= 1 and phase.calls("sweep") == 0, report
    figures = {
        "exchange": (phase.inside("exchange") / JOBS, EXCHANGE_BUDGET),
        "ack": (phase.inside("ack") / JOBS, ACK_BUDGET),
        "all": (everything, DRAIN_BUDGET),
    }
    over = {name: f"{v:.3f} > {b:.3f}" for name, (v, b) in figures.items() if v > b}
    assert not over, f"commands per job over budget: {over} ({report})"
