"""OpenTelemetry spans end to end: a real server, a real worker, an in-memory exporter.

Each test gives Fairlane an SDK tracer provider of its own (``fairlane.tracing.
set_tracer_provider``), so that no test touches the process-wide provider, and checks
the spans the producer and the worker recorded and the trace field the job stored.
"""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, TraceState

from fairlane import App, Backoff, Context, tracing
from fairlane.config.pools import parse_config
from tests.e2e.helpers import WAIT, fast_settings, make_app, running_worker

pytestmark = pytest.mark.anyio

NO_WAIT = Backoff(base=0.01, cap=0.01, jitter="none")


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _one(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    (span,) = _named(exporter, name)
    return span


def _child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    return (
        span.parent is not None
        and parent.context is not None
        and span.parent.span_id == parent.context.span_id
        and span.parent.trace_id == parent.context.trace_id
    )


async def _stored(app: App, job_id: str) -> str | None:
    (value,) = await app.store.job_fields(job_id, "tp")
    return value.decode() if value is not None else None


def _traceparent(span: ReadableSpan) -> str:
    assert span.context is not None
    flags = span.context.trace_flags
    return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-{flags:02x}"


async def test_a_job_yields_a_send_span_and_its_process_span_in_one_trace(
    redis_url: str, namespace: str, spans: InMemorySpanExporter
) -> None:
    app = make_app(namespace, redis_url)

    @app.task(lane="light")
    async def shout(text: str) -> str:
        # the attempt's span is current inside the task
        assert trace.get_current_span().get_span_context().is_valid
        return text.upper()

    async with app, running_worker(app, lanes=["light"]):
        await app.tenants.configure("acme", classes=["guaranteed"])  # a restricted class
        job = await shout.enqueue("hi", tenant="acme", service_class="guaranteed")
        assert await job.result(timeout=WAIT) == "HI"
        stored = await _stored(app, job.id)

    send = _one(spans, "send light")
    process = _one(spans, "process light")
    assert send.kind == SpanKind.PRODUCER
    assert process.kind == SpanKind.CONSUMER
    assert _child_of(process, send), "the attempt continues the producer's trace"
    assert stored == _traceparent(send), "the job stores the send span's context"
    assert send.attributes is not None and process.attributes is not None
    assert dict(send.attributes) == {
        "messaging.system": "fairlane",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "light",
        "messaging.message.id": job.id,
        "fairlane.task": shout.name,
        "fairlane.tenant": "acme",
        "fairlane.class": "guaranteed",
        "fairlane.admission.verdict": "accepted",
    }
    attrs = dict(process.attributes)
    wait = attrs.pop("messaging.fairlane.queue_wait_ms")
    assert isinstance(wait, int) and 0 <= wait < WAIT * 1000
    assert attrs == {
        "messaging.system": "fairlane",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "light",
        "messaging.message.id": job.id,
        "fairlane.task": shout.name,
        "fairlane.tenant": "acme",
        "fairlane.class": "guaranteed",  # the job's own class, not the task's default
        "fairlane.attempt": 1,
        "fairlane.max_attempts": 3,
        "fairlane.outcome": "completed",
    }
    assert process.status.status_code == StatusCode.UNSET


async def test_a_retried_job_has_one_process_span_per_attempt(
    redis_url: str, namespace: str, spans: InMemorySpanExporter
) -> None:
    app = make_app(namespace, redis_url)
    calls = 0

    @app.task(attempts=3, backoff=NO_WAIT)
    async def flaky() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise LookupError("not yet")
        return calls

    async with app, running_worker(app):
        job = await flaky.enqueue()
        assert await job.result(timeout=WAIT) == 2

    lane = flaky.options.lane
    send = _one(spans, f"send {lane}")
    first, second = sorted(
        _named(spans, f"process {lane}"),
        key=lambda s: s.attributes["fairlane.attempt"] if s.attributes else 0,
    )
    assert _child_of(first, send) and _child_of(second, send)
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["fairlane.attempt"] == 1
    assert first.attributes["fairlane.outcome"] == "retry"
    assert first.attributes["error.type"] == "LookupError"
    assert first.status.status_code == StatusCode.ERROR
    (event,) = first.events
    assert event.name == "exception" and event.attributes is not None
    assert event.attributes["exception.type"] == "LookupError"
    assert event.attributes["exception.message"] == "not yet"
    assert "raise LookupError" in str(event.attributes["exception.stacktrace"])
    assert second.attributes["fairlane.attempt"] == 2
    assert second.attributes["fairlane.outcome"] == "completed"
    assert second.status.status_code == StatusCode.UNSET
    assert not second.events


async def test_a_failed_job_ends_with_an_error_span(
    redis_url: str, namespace: str, spans: InMemorySpanExporter
) -> None:
    app = make_app(namespace, redis_url)

    @app.task(attempts=1)
    async def broken() -> None:
        raise ValueError("no")

    async with app, running_worker(app):
        job = await broken.enqueue()
        with pytest.raises(Exception, match="no"):
            await job.result(timeout=WAIT)

    process = _one(spans, f"process {broken.options.lane}")
    assert process.attributes is not None
    assert process.attributes["fairlane.outcome"] == "failed"
    assert process.status.status_code == StatusCode.ERROR
    assert process.status.description == "ValueError: no"


async def test_workflow_steps_are_children_of_their_slice(
    redis_url: str, namespace: str, spans: InMemorySpanExporter
) -> None:
    app = make_app(namespace, redis_url)

    @app.task
    async def child(n: int) -> int:
        return n + 1

    async def add(a: int, b: int) -> int:
        return a + b

    @app.workflow(slice_steps=1)
    async def flow(ctx: Context, n: int) -> int:
        first = await ctx.step("first", add, n, 1)
        second = await ctx.step("second", add, first, 1)
        return await ctx.run(child, second)

    async with app, running_worker(app):
        job = await flow.enqueue(1)
        assert await job.result(timeout=WAIT) == 4

    lane = flow.options.lane
    (send,) = [s for s in _named(spans, f"send {lane}") if s.parent is None]
    slices = [
        s
        for s in _named(spans, f"process {lane}")
        if s.attributes and s.attributes["fairlane.task"] == flow.name
    ]
    assert len(slices) >= 3, "a slice per new step, and one for the child's result"
    assert all(_child_of(s, send) for s in slices), "every slice continues the run's trace"
    # replayed steps have no span: each step has exactly one, under the slice that ran it
    first, second = _one(spans, "step first"), _one(spans, "step second")
    (ran_first,) = [s for s in slices if _child_of(first, s)]
    (ran_second,) = [s for s in slices if _child_of(second, s)]
    assert ran_first is not ran_second, "one new step per slice (slice_steps=1)"
    assert first.attributes is not None
    assert first.attributes["fairlane.workflow.run_id"] == job.id
    assert first.attributes["fairlane.step.attempt"] == 1
    # the child is sent from a slice, and its attempt continues that trace
    child_send = [
        s for s in _named(spans, f"send {child.options.lane}") if s is not send and s.parent
    ]
    (child_send_span,) = child_send
    assert any(_child_of(child_send_span, s) for s in slices)
    assert child_send_span.attributes is not None
    assert child_send_span.attributes["fairlane.workflow.parent"] == job.id
    (child_process,) = [
        s
        for s in _named(spans, f"process {child.options.lane}")
        if s.attributes and s.attributes["fairlane.task"] == child.name
    ]
    assert _child_of(child_process, child_send_span)


async def test_a_failed_step_records_its_exception(
    redis_url: str, namespace: str, spans: InMemorySpanExporter
) -> None:
    app = make_app(namespace, redis_url)
    tries = 0

    async def charge() -> str:
        nonlocal tries
        tries += 1
        if tries == 1:
            raise ConnectionError("card service down")
        return "ok"

    @app.workflow(attempts=3, backoff=NO_WAIT)
    async def flow(ctx: Context) -> str:
        return await ctx.step("charge", charge)

    async with app, running_worker(app):
        job = await flow.enqueue()
        assert await job.result(timeout=WAIT) == "ok"

    failed, passed = sorted(
        _named(spans, "step charge"),
        key=lambda s: s.attributes["fairlane.step.attempt"] if s.attributes else 0,
    )
    assert failed.status.status_code == StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    assert passed.status.status_code == StatusCode.UNSET
    assert passed.attributes is not None and passed.attributes["fairlane.step.attempt"] == 2


async def test_trace_false_stores_no_context_and_the_attempt_starts_a_new_trace(
    redis_url: str, namespace: str, spans: InMemorySpanExporter
) -> None:
    app = make_app(namespace, redis_url)

    @app.task
    async def noop() -> None:
        return None

    async with app, running_worker(app):
        job = await noop.enqueue(trace=False)
        await job.result(timeout=WAIT)
        stored = await _stored(app, job.id)

    lane = noop.options.lane
    send = _one(spans, f"send {lane}")
    process = _one(spans, f"process {lane}")
    assert stored is None
    assert send.attributes is not None and send.attributes["fairlane.trace_stored"] is False
    assert process.parent is None
    assert process.context is not None and send.context is not None
    assert process.context.trace_id != send.context.trace_id


async def test_tracestate_travels_with_the_job(
    redis_url: str, namespace: str, spans: InMemorySpanExporter
) -> None:
    app = make_app(namespace, redis_url)

    @app.task
    async def noop() -> None:
        return None

    upstream = trace.SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
        span_id=0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "opaque-value")]),
    )
    async with app, running_worker(app):
        with trace.use_span(trace.NonRecordingSpan(upstream)):
            job = await noop.bind().enqueue(tenant="acme")
        await job.result(timeout=WAIT)
        stored = await _stored(app, job.id)

    send = _one(spans, f"send {noop.options.lane}")
    process = _one(spans, f"process {noop.options.lane}")
    assert stored == f"{_traceparent(send)} vendor=opaque-value"
    assert send.context is not None and send.context.trace_id == upstream.trace_id
    assert _child_of(process, send)
    assert process.context is not None
    assert process.context.trace_state.get("vendor") == "opaque-value"


async def test_a_refused_submission_is_an_error_send_span(
    redis_url: str, namespace: str, spans: InMemorySpanExporter
) -> None:
    app = make_app(namespace, redis_url)

    @app.task
    async def later() -> None:
        return None

    async with app:
        # due in a minute, dead in a second: the store refuses it
        admission = await later.submit(delay=60, deadline=1)

    assert admission.status == "rejected"
    send = _one(spans, f"send {later.options.lane}")
    assert send.attributes is not None
    assert send.attributes["fairlane.admission.verdict"] == "rejected"
    assert send.attributes["fairlane.admission.reason"] == "deadline_unmeetable"
    assert send.status.status_code == StatusCode.ERROR


@pytest.mark.parametrize("when_full", ["defer", "reject"])
async def test_the_send_span_carries_the_admission_decision(
    redis_url: str, namespace: str, spans: InMemorySpanExporter, when_full: str
) -> None:
    config = {
        "pools": {
            "default": {
                "capacity_units": 1,
                "classes": {"standard": {"nominal_share": 1.0, "response_when_full": when_full}},
            }
        },
        "estimation": {"safety_multiplier": 1.0},
    }
    app = App(namespace, redis_url=redis_url, settings=fast_settings(), config=parse_config(config))

    @app.task(lane="default")
    async def noop() -> None:
        return None

    async with app:
        first = await noop.submit(tenant="acme")  # takes the pool's one unit
        second = await noop.submit(tenant="acme")
        stored = await _stored(app, second.job.id) if second.job is not None else None

    assert first.status == "accepted"
    accepted, refused = sorted(
        _named(spans, "send default"),
        key=lambda s: (
            s.attributes["fairlane.admission.verdict"] != "accepted" if s.attributes else True
        ),
    )
    assert accepted.attributes is not None and refused.attributes is not None
    assert accepted.attributes["fairlane.admission.verdict"] == "accepted"
    assert refused.attributes["fairlane.admission.reason"] == "class_full"
    if when_full == "defer":
        assert second.status == "deferred" and second.job is not None
        assert refused.attributes["fairlane.admission.verdict"] == "deferred"
        assert refused.status.status_code == StatusCode.UNSET, "a deferred job is stored"
        assert stored == _traceparent(refused)
    else:
        assert second.status == "rejected" and second.retry_after is not None
        assert refused.attributes["fairlane.admission.verdict"] == "rejected"
        assert refused.attributes["fairlane.admission.retry_after"] == second.retry_after
        assert refused.attributes["error.type"] == "class_full"
        assert refused.status.status_code == StatusCode.ERROR


async def test_a_batch_has_one_send_span_and_every_job_its_context(
    redis_url: str, namespace: str, spans: InMemorySpanExporter
) -> None:
    app = make_app(namespace, redis_url)

    @app.task
    async def double(n: int) -> int:
        return 2 * n

    async with app, running_worker(app):
        jobs = await double.enqueue_many([(1,), (2,), (3,)])
        assert [await j.result(timeout=WAIT) for j in jobs] == [2, 4, 6]
        stored = {await _stored(app, j.id) for j in jobs}

    send = _one(spans, f"send {double.options.lane}")
    assert send.attributes is not None
    assert send.attributes["messaging.batch.message_count"] == 3
    assert stored == {_traceparent(send)}
    processes = _named(spans, f"process {double.options.lane}")
    assert len(processes) == 3 and all(_child_of(p, send) for p in processes)


async def test_without_a_provider_nothing_is_traced_or_stored(
    redis_url: str, namespace: str
) -> None:
    tracing.set_tracer_provider(None)
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider), (
        "no test may set the process-wide provider"
    )
    assert tracing.active_tracer() is None
    app = make_app(namespace, redis_url)
    seen: list[str] = []

    @app.task
    async def noop() -> None:
        seen.append(app.name)

    @app.workflow()
    async def flow(ctx: Context) -> None:
        await ctx.run(noop)

    async with app, running_worker(app):
        job = await noop.enqueue()
        await job.result(timeout=WAIT)
        run = await flow.enqueue()
        await run.result(timeout=WAIT)
        fields = [await _stored(app, i) for i in (job.id, run.id, f"{run.id}.0.0")]

    assert seen == [app.name, app.name]
    assert fields == [None, None, None]
