"""Cost feedback with real workers: what jobs report they used comes back as charges.

A tenant that declares tiny estimates for huge jobs is reserved and charged its real
cost from its next job on; a tenant whose jobs cost ten times more gets about a tenth
of the dispatches; every job records what it reserved, what it was charged and what it
used. Counted, never timed.
"""

from __future__ import annotations

from typing import Literal

import pytest

import fairlane
from fairlane import App, Estimate, FairlaneConfig
from fairlane.config.pools import Pool
from fairlane.policy.admission import EstimationSettings, PoolConfig
from fairlane.policy.classes import ClassTable
from tests.e2e.helpers import WAIT, fast_settings, running_worker

pytestmark = pytest.mark.anyio

TOKENS = 20_000  # what each job really uses: 20 units at 1 unit per 1k tokens


def _app(namespace: str, redis_url: str) -> App:
    pool = Pool("default", ClassTable(), PoolConfig(capacity_units=1_000))
    config = FairlaneConfig(
        pools={"default": pool},
        estimation=EstimationSettings(max_reservation_units=100, safety_multiplier=1.0),
    )
    return App(namespace, redis_url=redis_url, settings=fast_settings(), config=config)


async def test_a_tenant_declaring_tiny_estimates_is_charged_its_real_cost(
    redis_url: str, namespace: str
) -> None:
    app = _app(namespace, redis_url)

    @app.task
    async def research(n: int) -> int:
        fairlane.context().report_usage(input_tokens=TOKENS // 2, output_tokens=TOKENS // 2)
        return n

    tiny = Estimate(input_tokens=10, max_output_tokens=0)  # declares 0.01 units
    infos = []
    async with app, running_worker(app, concurrency=1):
        for n in range(4):
            admission = await research.submit(n, tenant="sly", estimate=tiny)
            assert admission.status == "accepted" and admission.job is not None
            await admission.job.result(timeout=WAIT)
            infos.append(await admission.job.info())
    # the first job is reserved what it declared; from the second on, what jobs of this
    # tenant, workflow and model were learned to cost (the first sample is taken as is)
    assert infos[0].reserved_units == 0.01
    assert [i.reserved_units for i in infos[1:]] == [20.0, 20.0, 20.0]
    assert [i.charged_units for i in infos[1:]] == [20.0, 20.0, 20.0]
    assert all(19.9 <= (i.actual_units or 0) <= 20.5 for i in infos), infos


async def _heavy_and_light(
    redis_url: str, namespace: str, charge: Literal["jobs", "cost"], light_jobs: int
) -> list[str]:
    """Who ran, in order: 30 jobs of 10k tokens from "heavy", then ``light_jobs`` jobs
    of 1k tokens from "light", all queued before one worker slot starts them."""
    app = App(namespace, redis_url=redis_url, settings=fast_settings(), charge=charge)
    order: list[str] = []

    @app.task
    async def call(owner: str, tokens: int) -> None:
        order.append(owner)
        fairlane.context().report_usage(input_tokens=tokens)

    async with app:
        jobs = [
            *await call.enqueue_many([("heavy", 10_000)] * 30, tenant="heavy"),
            *await call.enqueue_many([("light", 1_000)] * light_jobs, tenant="light"),
        ]
        async with running_worker(app, concurrency=1):
            for job in jobs:
                await job.result(timeout=WAIT)
    return order


async def test_a_tenant_whose_jobs_cost_more_is_charged_for_it(
    redis_url: str, namespace: str
) -> None:
    order = await _heavy_and_light(redis_url, namespace, "cost", light_jobs=60)
    # charged by what they used, 10 units against 1: once both have run, light gets
    # about ten dispatches for each of heavy's while both are backlogged
    window = order[2:46]
    assert window.count("heavy") <= 6, window
    assert order.count("heavy") == 30


async def test_charging_by_jobs_ignores_cost(redis_url: str, namespace: str) -> None:
    order = await _heavy_and_light(redis_url, namespace, "jobs", light_jobs=30)
    # one unit per job: the two alternate, whatever the jobs cost
    assert 19 <= order[:40].count("heavy") <= 21, order


async def test_report_usage_outside_a_task_and_bad_usage_are_refused() -> None:
    with pytest.raises(RuntimeError, match="inside a running task"):
        fairlane.report_usage(input_tokens=1)
    ctx = fairlane.JobContext("j", "t", 1)
    for bad in ({"input_tokens": -1}, {"tool_calls": 1.5}, {"tool_seconds": float("nan")}):
        with pytest.raises(ValueError):
            ctx.report_usage(**bad)  # type: ignore[arg-type]
    ctx.report_usage(input_tokens=500, output_tokens=500, tool_calls=2, model="m")
    assert ctx.units(fairlane.Coefficients(models={"m": 3.0}), wall_seconds=10.0) == 3.0 + 0.5 + 1.0
