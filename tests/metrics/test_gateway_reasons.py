"""The gateway's admission answers keep the reason the caller was told, for every reason
an admission can give: a pool's, a lane's default queue bounds', the store's and the
front door's. A reason missing from the gateway's list would be labelled ``other`` and
lost to dashboards.
"""

from __future__ import annotations

import json
from typing import get_args

import httpx
import pytest

from fairlane import Rejected
from fairlane.gateway import create_app
from fairlane.gateway.frontdoor import REASONS as FRONT_DOOR_REASONS
from fairlane.gateway.metrics import GatewayMetrics
from fairlane.policy.admission.bounds import QueueReason
from fairlane.policy.admission.gate import Reason
from fairlane.policy.admission.memory import StoreFullReason
from fairlane.policy.admission.reasons import REJECTION_REASONS
from tests.gateway.helpers import ADMIN_KEY, gateway
from tests.metrics.helpers import parse, series

ANSWERS = "fairlane_gateway_admissions_total"
# what the store itself may answer, beside the policy's reasons (only an unreachable
# store is a 503; a busy one is backpressure)
STORE_REASONS = ("store_unavailable", "store_busy")


def test_every_reason_an_admission_gives_is_its_own_label() -> None:
    reasons = sorted(
        {
            *get_args(Reason),
            *get_args(QueueReason),
            *get_args(StoreFullReason),
            *REJECTION_REASONS,
            *STORE_REASONS,
            *FRONT_DOOR_REASONS,
        }
    )
    assert "lane_queue_full" in reasons and "tenant_queue_full" in reasons
    metrics = GatewayMetrics()
    for reason in reasons:
        status = 503 if reason == "store_unavailable" else 429
        body = json.dumps({"reason": reason, "retry_after_seconds": 1}).encode()
        metrics.observe("POST", "/v1/jobs", status, 0.001, body)
    metrics.observe("POST", "/v1/jobs", 429, 0.001, b'{"reason": "a_reason_nobody_gives"}')
    told = series(parse(metrics.render().decode()), ANSWERS)
    labels = {dict(key)["reason"]: n for key, n in told.items()}
    assert labels == {**dict.fromkeys(reasons, 1), "other": 1}


@pytest.mark.anyio
async def test_a_default_lane_bound_refusal_is_counted_by_its_reason(
    redis_url: str, namespace: str
) -> None:
    async with gateway(namespace, redis_url, queues={"lane_max_queued": 2}) as gw:
        # a batch reads the lane's count and marks it full: the next single job is refused
        with pytest.raises(Rejected) as caught:
            await gw.app.get_task("echo").enqueue_many([("x",)] * 3, tenant="seed")
        assert caught.value.reason == "lane_queue_full"
        api = create_app(gw.app, admin_key=ADMIN_KEY)  # serves /metrics by default
        auth = await gw.key("acme")
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            r = await c.post("/v1/jobs", json={"task": "echo", "args": ["x"]}, headers=auth)
            assert r.status_code == 429 and r.json()["reason"] == "lane_queue_full", r.text
            scraped = await c.get("/metrics")
    assert scraped.status_code == 200
    assert series(parse(scraped.text), ANSWERS) == {
        (("reason", "lane_queue_full"), ("verdict", "rejected")): 1,
    }
