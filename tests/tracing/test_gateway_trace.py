"""A caller's trace continues through the HTTP gateway, the job and its worker.

A service in any language that sends a W3C ``traceparent`` with ``POST /v1/jobs`` gets
the job's ``send`` span as a child of its own span, and the worker's ``process`` span in
the same trace.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.e2e.helpers import WAIT, eventually, running_worker
from tests.gateway.helpers import gateway

pytestmark = pytest.mark.anyio

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CALLER_SPAN = 0x00F067AA0BA902B7


async def test_a_callers_traceparent_reaches_the_worker(
    redis_url: str, namespace: str, spans: InMemorySpanExporter
) -> None:
    async with gateway(namespace, redis_url) as gw:
        headers = await gw.key("acme")
        headers["traceparent"] = f"00-{TRACE_ID:032x}-{CALLER_SPAN:016x}-01"
        headers["tracestate"] = "vendor=abc"
        body = {"task": "add", "args": [2, 3]}
        reply = await gw.client.post("/v1/jobs", json=body, headers=headers)
        assert reply.status_code == 202, reply.text
        job_id = reply.json()["id"]
        (stored,) = await gw.app.store.job_fields(job_id, "tp")
        assert stored is not None and f"{TRACE_ID:032x}" in stored.decode()
        assert stored.decode().endswith(" vendor=abc")
        async with running_worker(gw.app):
            status, _, _ = await asyncio.wait_for(gw.app.wait_finished(job_id), WAIT)
            assert status == "completed"

            async def processed() -> bool:
                return any(s.name == "process default" for s in spans.get_finished_spans())

            await eventually(processed)

    by_name = {s.name: s for s in spans.get_finished_spans()}
    send, process = by_name["send default"], by_name["process default"]
    assert send.kind is SpanKind.PRODUCER and process.kind is SpanKind.CONSUMER
    assert send.parent is not None and send.parent.span_id == CALLER_SPAN
    assert send.context is not None and send.context.trace_id == TRACE_ID
    assert send.attributes is not None
    assert send.attributes["fairlane.admission.verdict"] == "accepted"
    assert send.attributes["fairlane.tenant"] == "acme"
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert process.context is not None and process.context.trace_id == TRACE_ID


async def test_without_a_traceparent_the_gateway_starts_the_trace(
    redis_url: str, namespace: str, spans: InMemorySpanExporter
) -> None:
    async with gateway(namespace, redis_url) as gw:
        headers = await gw.key("acme")
        reply = await gw.client.post(
            "/v1/jobs", json={"task": "add", "args": [1, 1]}, headers=headers
        )
        assert reply.status_code == 202
    (send,) = [s for s in spans.get_finished_spans() if s.name == "send default"]
    assert send.parent is None
