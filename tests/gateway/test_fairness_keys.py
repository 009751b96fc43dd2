"""The gateway's submit with a fairness key: the tenant is still the API key's, the
fairness key the body's; the job's view shows it; a bad key is a 422 and stores nothing."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import app_keys
from tests.gateway.helpers import gateway

pytestmark = pytest.mark.anyio


async def test_submit_with_a_fairness_key(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url) as gw:
        auth = await gw.key("acme")
        body = {"task": "add", "args": [1, 2], "fairness_key": "user-42"}
        r = await gw.client.post("/v1/jobs", json=body, headers=auth)
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        assert len(await app_keys(redis_url, namespace, "job:*")) == 1
        view = (await gw.client.get(f"/v1/jobs/{job_id}", headers=auth)).json()
        assert view["tenant"] == "acme" and view["fairness_key"] == "user-42"
        record = await gw.app.store_for_job(job_id).read_job(job_id)
        assert record is not None and record.fairness_key == "user-42"
        plain = await gw.client.post("/v1/jobs", json={"task": "add", "args": [1, 2]}, headers=auth)
        view = (await gw.client.get(f"/v1/jobs/{plain.json()['id']}", headers=auth)).json()
        assert view["fairness_key"] is None


@pytest.mark.parametrize("bad", ["", "user\x00one", "k" * 201, 42])
async def test_a_bad_fairness_key_is_a_422_and_nothing_is_stored(
    redis_url: str, namespace: str, bad: object
) -> None:
    async with gateway(namespace, redis_url) as gw:
        auth = await gw.key("acme")
        before = await app_keys(redis_url, namespace, "job:*")
        body = {"task": "add", "args": [1, 2], "fairness_key": bad}
        r = await gw.client.post("/v1/jobs", json=body, headers=auth)
        assert r.status_code == 422, r.text
        assert "fairness_key" in r.text
        assert await app_keys(redis_url, namespace, "job:*") == before
