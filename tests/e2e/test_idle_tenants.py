"""A tenant idle for ``tenants.idle_ttl`` comes back as a new one, with real workers.

A tenant that declares tiny estimates for jobs of 20 units is reserved 20 units from
its second job on (its learned cost). It then goes quiet past the idle ttl: the
worker's tenant sweep forgets the learned cost, so its next job is reserved what it
declares again, the default estimate, and the one after it what was learned anew.
Counted, never timed.
"""

from __future__ import annotations

import pytest

import fairlane
from fairlane import App, Estimate, FairlaneConfig
from fairlane.config.pools import Pool
from fairlane.policy.admission import EstimationSettings, PoolConfig
from fairlane.policy.classes import ClassTable
from fairlane.store.connection import create_sync_client
from tests.e2e.helpers import WAIT, eventually, fast_settings, running_worker

pytestmark = pytest.mark.anyio

TOKENS = 20_000  # 20 units at 1 unit per 1k tokens


async def test_a_tenant_back_after_the_idle_ttl_starts_from_the_default_estimate(
    redis_url: str, namespace: str
) -> None:
    pool = Pool("default", ClassTable(), PoolConfig(capacity_units=1_000))
    config = FairlaneConfig(
        pools={"default": pool},
        estimation=EstimationSettings(max_reservation_units=100, safety_multiplier=1.0),
    )
    settings = fast_settings(tenants={"idle_ttl": 1.0, "sweep_interval": 0.2})
    app = App(namespace, redis_url=redis_url, settings=settings, config=config)

    @app.task
    async def research(n: int) -> int:
        fairlane.context().report_usage(input_tokens=TOKENS // 2, output_tokens=TOKENS // 2)
        return n

    tiny = Estimate(input_tokens=10, max_output_tokens=0)  # declares 0.01 units
    client = create_sync_client(redis_url)

    async def run(n: int) -> float | None:
        admission = await research.submit(n, tenant="back", estimate=tiny)
        assert admission.status == "accepted" and admission.job is not None
        await admission.job.result(timeout=WAIT)
        return (await admission.job.info()).reserved_units

    try:
        async with app, running_worker(app, concurrency=1):
            pattern = app.sharded.store_for_tenant("back").keys.match_all()[:-1] + "cost:back|*"
            before = [await run(n) for n in range(2)]
            assert client.keys(pattern)  # learned, under the name the pattern gives

            async def forgotten() -> bool:
                return not client.keys(pattern)

            await eventually(forgotten, timeout=15)
            after = [await run(n) for n in range(2, 4)]
    finally:
        client.close()
    assert before == [0.01, 20.0]
    assert after == [0.01, 20.0]
