"""Start-time estimates over HTTP (``fairlane.app.startestimate``, the rule in
``fairlane.policy.startpredict``).

The tenant's jobs are learned to take 10 s each (``store.learn_durations``, as a
worker's batch folds them), and the lane gets its live capacity from one worker's
exchange of one slot, which leases the first job and holds it: the jobs submitted after
it wait, and nothing moves while the test reads their estimates. A submit with a
deadline, or with ``estimate_start``, answers 202 with ``estimated_start``; a deadline
the job is not expected to meet is 429 ``deadline_unmeetable`` with the estimate and no
Retry-After, unless ``on_unmeetable`` is ``accept``; a waiting job's view carries its
estimate and its basis, a running one's none.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fairlane.config.lanes import DEFAULT_CLASS
from fairlane.store.durations import class_field, task_field, tenant_field
from tests.gateway.helpers import Gateway, gateway

pytestmark = pytest.mark.anyio

RUN_MS = 10_000.0


async def _learn(gw: Gateway, tenant: str) -> None:
    lane = gw.app.settings.default_lane
    await gw.app.sharded.store_for_tenant(tenant).learn_durations(
        [
            (task_field("echo", tenant), 1, RUN_MS),
            (tenant_field(lane, DEFAULT_CLASS, tenant), 1, RUN_MS),
            (class_field(lane, DEFAULT_CLASS), 1, RUN_MS),
        ]
    )


def _at(text: str | None) -> datetime:
    assert text is not None
    when = datetime.fromisoformat(text)
    assert when.utcoffset() == timedelta(0)
    return when


async def test_submits_carry_the_estimate_and_an_unmeetable_deadline_is_429(
    redis_url: str, namespace: str
) -> None:
    async with gateway(namespace, redis_url) as gw:
        acme = await gw.key("acme")

        async def submit(**fields: object) -> dict[str, object]:
            r = await gw.client.post("/v1/jobs", json={"task": "echo", **fields}, headers=acme)
            assert r.status_code == 202, r.text
            body: dict[str, object] = r.json()
            return body

        await _learn(gw, "acme")
        first = await submit()
        assert first["estimated_start"] is None  # not asked: not estimated
        # no worker yet: nothing can be said, so a deadline is taken and the view says why
        taken = await submit(deadline_seconds=5)
        assert taken["estimated_start"] is None
        view = (await gw.client.get(f"/v1/jobs/{taken['id']}", headers=acme)).json()
        assert view["estimated_start"] is None
        assert view["start_estimate"]["why_none"] == "no live worker serves its lane"
        await gw.client.delete(f"/v1/jobs/{taken['id']}", headers=acme)

        store = gw.app.store_for_job(str(first["id"]))
        got = await store.exchange("w1", [gw.app.settings.default_lane], 1, 60_000, slots=1)
        assert [j.id for j in got.jobs] == [first["id"]]  # its one slot is held from here
        now = datetime.now(UTC)
        later = await submit(deadline_seconds=3600)
        start = _at(str(later["estimated_start"]))
        assert now < start < now + timedelta(hours=1)
        asked = await submit(estimate_start=True)
        assert _at(str(asked["estimated_start"])) > start  # one more 10 s job ahead of it

        late = {"task": "echo", "deadline_seconds": 5}
        refused = await gw.client.post("/v1/jobs", json=late, headers=acme)
        assert refused.status_code == 429, refused.text
        body = refused.json()
        assert body["reason"] == "deadline_unmeetable"
        assert _at(body["estimated_start"]) > start
        assert "retry_after_seconds" not in body and "Retry-After" not in refused.headers
        assert refused.headers["Cache-Control"] == "no-store"
        accepted = await submit(**late, on_unmeetable="accept")
        assert _at(str(accepted["estimated_start"])) > start
        bad = await gw.client.post("/v1/jobs", json={**late, "on_unmeetable": "x"}, headers=acme)
        assert bad.status_code == 422 and bad.json()["reason"] == "invalid"

        view = (await gw.client.get(f"/v1/jobs/{later['id']}", headers=acme)).json()
        assert view["status"] == "queued"
        assert view["estimated_start"] is not None
        basis = view["start_estimate"]
        assert basis["why_none"] is None and basis["slots"] == 1 and basis["tenants"] == 1
        assert basis["jobs_ahead"] == 0 and basis["share"] == 1
        assert basis["expected_run_seconds"] == RUN_MS / 1000
        assert basis["wait_seconds"] > 0 and basis["work_ahead_slot_seconds"] > 0
        running = (await gw.client.get(f"/v1/jobs/{first['id']}", headers=acme)).json()
        assert running["status"] == "running"
        assert running["estimated_start"] is None and running["start_estimate"] is None

        metrics = gw.api.state.metrics.registry
        told = {"verdict": "rejected", "reason": "deadline_unmeetable"}
        assert metrics.get_sample_value("fairlane_gateway_admissions_total", told) == 1
