"""Restricted classes over HTTP: a tenant's key puts jobs only in classes it may use.

``POST /v1/jobs`` naming the (restricted) ``guaranteed`` class with the key of a tenant
not entitled to it answers 403 ``class_not_entitled`` and stores nothing; entitled, the
job is accepted in that class, and a tenant's default class applies to a body that
names none.
"""

from __future__ import annotations

import pytest

from tests.gateway.helpers import gateway, stored_keys

pytestmark = pytest.mark.anyio

GUARANTEED = {"task": "echo", "kwargs": {"text": "hi"}, "service_class": "guaranteed"}


async def test_a_restricted_class_without_entitlement_is_403_and_nothing_is_stored(
    redis_url: str, namespace: str
) -> None:
    async with gateway(namespace, redis_url) as gw:
        headers = await gw.key("acme")
        before = await stored_keys(redis_url, namespace)
        answer = await gw.client.post("/v1/jobs", json=GUARANTEED, headers=headers)
        assert answer.status_code == 403, answer.text
        body = answer.json()
        assert body["reason"] == "class_not_entitled"
        assert "'guaranteed' is not one this tenant may use" in body["detail"]
        assert "retry-after" not in answer.headers
        # again, now with the key held: the enqueue checks key and class in one step
        again = await gw.client.post("/v1/jobs", json=GUARANTEED, headers=headers)
        assert (again.status_code, again.json()["reason"]) == (403, "class_not_entitled")
        assert await stored_keys(redis_url, namespace) == before
        # both refusals are in the audit trail (the first by the gateway, the second by
        # the enqueue script), as the answer said
        submits = await gw.keys.records.audit.read(10, action="submit")
        assert [(e.outcome, e.detail) for e in submits] == [
            ("rejected", "class_not_entitled"),
            ("rejected", "class_not_entitled"),
        ]


async def test_an_entitled_tenant_is_accepted_in_the_class_and_gets_its_default(
    redis_url: str, namespace: str
) -> None:
    async with gateway(namespace, redis_url) as gw:
        headers = await gw.key("acme")
        await gw.app.tenants.configure("acme", classes=["guaranteed"])
        answer = await gw.client.post("/v1/jobs", json=GUARANTEED, headers=headers)
        assert answer.status_code == 202, answer.text
        view = await gw.client.get(answer.json()["status_url"], headers=headers)
        assert view.json()["service_class"] == "guaranteed"
        await gw.app.tenants.configure("acme", default_class="guaranteed")
        plain = {"task": "echo", "kwargs": {"text": "hi"}}
        answer = await gw.client.post("/v1/jobs", json=plain, headers=headers)
        assert answer.status_code == 202, answer.text
        view = await gw.client.get(answer.json()["status_url"], headers=headers)
        assert view.json()["service_class"] == "guaranteed"
        # another tenant's key is not entitled by acme's setting
        other = await gw.client.post("/v1/jobs", json=GUARANTEED, headers=await gw.key("globex"))
        assert (other.status_code, other.json()["reason"]) == (403, "class_not_entitled")


async def test_the_spec_documents_the_refused_class(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url) as gw:
        spec = (await gw.client.get("/openapi.json")).json()
        forbidden = spec["paths"]["/v1/jobs"]["post"]["responses"]["403"]
        assert "class_not_entitled" in forbidden["description"]
