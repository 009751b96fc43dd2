"""What the gateway tells a caller beyond the verdict: a "not now" answer (429, 503) is
never cached, and the job view shows the job's retry envelope (``not_before``, the
deadline, the idempotency key) as ``job.info()`` reads it."""

from __future__ import annotations

import socket
from datetime import datetime, timedelta

import httpx
import pytest

from fairlane import App
from fairlane.app.job import Job
from fairlane.gateway import create_app
from tests.e2e.helpers import fast_settings
from tests.gateway.helpers import gateway, pool

pytestmark = pytest.mark.anyio


async def test_429_is_not_stored(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url, pool(2, "reject")) as gw:
        auth = await gw.key("acme")
        job = {"task": "echo", "estimate": 1.5}
        first = await gw.client.post("/v1/jobs", json=job, headers=auth)
        assert first.status_code == 202 and "cache-control" not in first.headers
        refused = await gw.client.post("/v1/jobs", json=job, headers=auth)
        assert refused.status_code == 429, refused.text
        assert refused.headers["Cache-Control"] == "no-store"
        assert int(refused.headers["Retry-After"]) >= 1


async def test_503_is_not_stored(namespace: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once the socket closes
    app = App(namespace, redis_url=f"redis://127.0.0.1:{port}/0", settings=fast_settings())

    @app.task(name="echo", gateway=True)
    async def echo() -> None: ...

    transport = httpx.ASGITransport(app=create_app(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        key = "flk_0123456789ab_" + "s" * 43
        r = await client.post(
            "/v1/jobs", json={"task": "echo"}, headers={"Authorization": f"Bearer {key}"}
        )
    assert r.status_code == 503, r.text
    assert r.headers["Cache-Control"] == "no-store"
    assert int(r.headers["Retry-After"]) >= 1


def _when(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


async def test_the_job_view_shows_the_retry_envelope(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url) as gw:
        auth = await gw.key("acme")
        body = {"task": "echo", "deadline_seconds": 90, "idempotency_key": "invoice-12"}
        submitted = (await gw.client.post("/v1/jobs", json=body, headers=auth)).json()
        view = (await gw.client.get(submitted["status_url"], headers=auth)).json()
        enqueued = _when(view["enqueued_at"])
        assert enqueued is not None
        assert _when(view["not_before"]) == enqueued
        assert _when(view["deadline"]) == enqueued + timedelta(seconds=90)
        assert view["idempotency_key"] == "invoice-12"
        # the view is job.info()'s snapshot, times as ISO text
        info = await Job(gw.app.tasks["echo"], submitted["id"]).info()
        assert (info.not_before, info.deadline, info.idempotency_key) == (
            _when(view["not_before"]),
            _when(view["deadline"]),
            view["idempotency_key"],
        )
        plain = (await gw.client.post("/v1/jobs", json={"task": "echo"}, headers=auth)).json()
        shown = (await gw.client.get(plain["status_url"], headers=auth)).json()
        assert shown["deadline"] is None and shown["idempotency_key"] is None
        assert shown["not_before"] == shown["enqueued_at"]


async def test_the_spec_documents_the_envelope_and_no_store(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url) as gw:
        spec = (await gw.client.get("/openapi.json")).json()
    view = spec["components"]["schemas"]["JobView"]["properties"]
    assert {"not_before", "deadline", "idempotency_key"} <= set(view)
    submit = spec["paths"]["/v1/jobs"]["post"]["responses"]
    for code in ("429", "503"):
        assert submit[code]["headers"]["Cache-Control"]["schema"]["enum"] == ["no-store"]
