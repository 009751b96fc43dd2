"""OpenTelemetry spans for Fairlane: the optional ``fairlane[otel]`` extra.

This module owns everything Fairlane knows about tracing: whether it is on, the spans
it opens (submitting a job, running an attempt, running a workflow step), their
attributes, and the W3C trace context a job carries from its producer to its workers.
Only ``opentelemetry-api`` is needed; spans go wherever the application's tracer
provider sends them. The producer's spans are opened by the app (``fairlane.app``) and
the gateway; the worker's by ``TracingHooks``, which whoever builds a worker plugs
into it (``fairlane.runtime.hooks``): the runtime itself does not import this module.

Tracing is on when the API is installed and a tracer provider is set, globally
(``opentelemetry.trace.set_tracer_provider``) or for Fairlane alone
(:func:`set_tracer_provider`; a global provider set after Fairlane first looked is
found within ``RECHECK_SECONDS``). Otherwise every hook returns at once, and jobs carry
no trace field, so the store does no extra work.

Spans (attributes follow the OpenTelemetry messaging conventions, with
``messaging.system = "fairlane"`` and the lane as ``messaging.destination.name``):

``send <lane>`` (PRODUCER)
    Around ``submit``, ``enqueue`` and ``enqueue_many`` (and a workflow run starting its
    children). Carries the admission decision: ``fairlane.admission.verdict``
    (accepted, deferred, rejected, unavailable), ``fairlane.admission.reason`` and
    ``fairlane.admission.retry_after`` (seconds). A job that was not stored (rejected,
    or the store unreachable) ends the span with status ERROR.
``process <lane>`` (CONSUMER)
    One per attempt (for a workflow, one per slice), parented to the producer's
    ``send`` span through the trace context stored in the job; a job stored without
    one starts a new trace. ``fairlane.outcome`` says how the attempt ended
    (completed, retry, failed, cancelled, released, suspended, lease_lost); a failed
    attempt records its exception and ends with status ERROR.
    ``messaging.fairlane.queue_wait_ms`` is the time from the job's enqueue (server
    clock) to the start of this attempt (worker clock; never below 0): for a retry
    or a later slice it includes the earlier attempts and their backoff. An attribute
    rather than a span of its own, because the wait has no process of its own to
    report it: nothing runs between enqueue and start.
``step <name>`` (INTERNAL)
    A workflow step that runs, as a child of its slice's ``process`` span. A step
    replayed from its checkpoint runs nothing, so it has no span.

The job field ``tp`` holds the trace context as ``"<traceparent>"`` or
``"<traceparent> <tracestate>"`` (a traceparent has no spaces), written by the W3C
trace-context propagator and read back by it. ``trace=False`` on an enqueue leaves
it out for that job: its ``send`` span is still recorded (marked
``fairlane.trace_stored = false``), and each of its attempts starts a trace of its own.
Children a workflow run starts carry the context of the slice that started them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Final, Protocol, cast

from fairlane.codec import decode_error
from fairlane.runtime.hooks import WorkerHooks

try:
    from opentelemetry import context as _otel_context
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the extra is not installed: every hook below is a no-op
    AVAILABLE = False
else:
    AVAILABLE = True

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context as OtelContext
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from fairlane.registry import TaskDefinition
    from fairlane.runtime.steps import StepInfo
    from fairlane.store.wire import FetchedJob, NewJob, Outcome

__all__ = [
    "AVAILABLE",
    "Attempt",
    "TracingHooks",
    "active_tracer",
    "admitted",
    "sending",
    "set_tracer_provider",
    "step_span",
]

SYSTEM: Final = "fairlane"

_OUTCOMES: Final = {
    "ok": "completed",
    "retry": "retry",
    "dead": "failed",
    "cancel": "cancelled",
    "expire": "expired",
    "release": "released",
    "suspend": "suspended",
}
_FAILED: Final = frozenset({"retry", "dead"})
_OFF: Final[AbstractContextManager[None]] = nullcontext()

_propagator: Any = TraceContextTextMapPropagator() if AVAILABLE else None


#: how long "no provider is set" is believed before the API is asked again, in seconds
RECHECK_SECONDS: Final = 1.0


class _Switch:
    """The provider Fairlane was given, the tracer once one is found, and until when
    tracing is known to be off."""

    provider: TracerProvider | None = None
    tracer: Tracer | None = None
    off_until = 0.0


def set_tracer_provider(provider: TracerProvider | None) -> None:
    """Trace Fairlane with ``provider`` instead of the global one (None: the global again).

    For applications that keep Fairlane's spans apart, and for tests, which cannot
    replace a global provider once it is set. Takes effect at once.
    """
    _Switch.provider, _Switch.tracer, _Switch.off_until = provider, None, 0.0


def active_tracer() -> Tracer | None:
    """Fairlane's tracer, or None when tracing is off (no API, or no provider set).

    A global provider set after Fairlane first looked is found within
    ``RECHECK_SECONDS``.
    """
    if _Switch.tracer is not None:
        return _Switch.tracer
    if not AVAILABLE:
        return None
    # asking the API reads the environment (about 1.5 us): the hot path asks a clock
    now = time.monotonic()
    if now < _Switch.off_until:
        return None
    provider = _Switch.provider or _trace.get_tracer_provider()
    # the proxy stands in until a provider is set
    if isinstance(provider, _trace.ProxyTracerProvider | _trace.NoOpTracerProvider):
        _Switch.off_until = now + RECHECK_SECONDS
        return None
    # cached: a global provider, once set, is never replaced
    _Switch.tracer = provider.get_tracer("fairlane")
    return _Switch.tracer


# -- the job's trace context ------------------------------------------------------------


def _inject() -> str:
    """The current trace context as the job field stores it ("" when no span is active)."""
    headers: dict[str, str] = {}
    _propagator.inject(headers)
    parent = headers.get("traceparent", "")
    state = headers.get("tracestate")
    return f"{parent} {state}" if parent and state else parent


def _extract(field: str) -> OtelContext:
    """The producer's context from a job field; an empty context (a new trace) without one."""
    root = _otel_context.Context()
    if not field:
        return root
    parent, _, state = field.partition(" ")
    headers = {"traceparent": parent}
    if state:
        headers["tracestate"] = state
    result: OtelContext = _propagator.extract(headers, context=root)
    return result


# -- producer ---------------------------------------------------------------------------


def sending(
    lane: str, jobs: Sequence[NewJob], *, propagate: bool = True
) -> AbstractContextManager[Span | None]:
    """A ``send <lane>`` span around storing ``jobs``, which carry its context unless
    ``propagate`` is False (the span is recorded all the same).

    Yields None (and changes nothing) when tracing is off.
    """
    tracer = active_tracer()
    if tracer is None or not jobs:
        return _OFF
    return _send(tracer, lane, jobs, propagate)


@contextmanager
def _send(tracer: Tracer, lane: str, jobs: Sequence[NewJob], propagate: bool) -> Iterator[Span]:
    first = jobs[0]
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": lane,
        "fairlane.task": first.task,
        "fairlane.tenant": first.tenant,
        "fairlane.class": first.service_class,
    }
    if len(jobs) == 1:
        attributes["messaging.message.id"] = first.id
    else:
        attributes["messaging.batch.message_count"] = len(jobs)
    if first.parent:
        attributes["fairlane.workflow.parent"] = first.parent
    if not propagate:
        attributes["fairlane.trace_stored"] = False
    with tracer.start_as_current_span(
        f"send {lane}", kind=_trace.SpanKind.PRODUCER, attributes=attributes
    ) as span:
        carrier = _inject() if propagate else ""
        if carrier:
            for job in jobs:
                job.trace_context = carrier
        yield span


def continuing(headers: Mapping[str, str]) -> AbstractContextManager[object]:
    """Make a caller's W3C trace context current (an HTTP request's ``traceparent`` and
    ``tracestate`` headers), so the ``send`` span inside continues the caller's trace."""
    parent = headers.get("traceparent")
    if not parent or active_tracer() is None:
        return _OFF
    state = headers.get("tracestate")
    return _attached(_extract(f"{parent} {state}" if state else parent))


@contextmanager
def _attached(ctx: OtelContext) -> Iterator[None]:
    token = _otel_context.attach(ctx)
    try:
        yield
    finally:
        _otel_context.detach(token)


class _Handle(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def created(self) -> bool: ...


class _Answer(Protocol):
    """What a ``send`` span records of admission's answer (``fairlane.app.admission``)."""

    @property
    def status(self) -> str: ...

    @property
    def reason(self) -> str | None: ...

    @property
    def retry_after(self) -> float | None: ...

    @property
    def job(self) -> _Handle | None: ...

    @property
    def admitted(self) -> bool: ...


def admitted(span: Span | None, admission: _Answer) -> None:
    """Record admission's answer on a ``send`` span (None: tracing is off)."""
    if span is None:
        return
    span.set_attribute("fairlane.admission.verdict", admission.status)
    if admission.reason is not None:
        span.set_attribute("fairlane.admission.reason", admission.reason)
    if admission.retry_after is not None:
        span.set_attribute("fairlane.admission.retry_after", admission.retry_after)
    job = admission.job
    if job is not None:
        # an idempotency key may name a job stored earlier, under another id
        span.set_attribute("messaging.message.id", job.id)
        if not job.created:
            span.set_attribute("fairlane.duplicate", True)
    if not admission.admitted:
        # nothing was stored: the send failed, whether refused or unreachable
        reason = admission.reason or admission.status
        span.set_attribute("error.type", reason)
        span.set_status(_trace.StatusCode.ERROR, f"{admission.status}: {reason}")


# -- consumer ---------------------------------------------------------------------------


class Attempt:
    """An attempt's ``process`` span, current while the attempt runs."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: Span, token: Token[OtelContext]) -> None:
        self._span = span
        self._token = token

    def end(self, outcome: Outcome | None) -> None:
        """Close the span with the attempt's outcome (None: it has none, its lease was lost)."""
        span = self._span
        if outcome is None:
            span.set_attribute("fairlane.outcome", "lease_lost")
            span.set_status(_trace.StatusCode.ERROR, "the lease was lost; nothing was settled")
        else:
            span.set_attribute("fairlane.outcome", _OUTCOMES.get(outcome.kind, outcome.kind))
            if outcome.kind in _FAILED:
                _record_failure(span, outcome.payload)
        _otel_context.detach(self._token)
        span.end()


def _record_failure(span: Span, payload: str) -> None:
    """Record a failed attempt's error, as ``record_exception`` would, from its encoding:
    the exception itself may have been raised in another process."""
    info = decode_error(payload.encode())
    span.add_event(
        "exception",
        {
            "exception.type": info.type,
            "exception.message": info.message,
            "exception.stacktrace": info.traceback,
        },
    )
    span.set_attribute("error.type", info.type)
    span.set_status(_trace.StatusCode.ERROR, f"{info.type}: {info.message}")


# -- workflow steps ---------------------------------------------------------------------


def step_span(info: StepInfo) -> AbstractContextManager[Span | None]:
    """A ``step <name>`` span around a step that runs (not around a replayed one)."""
    tracer = active_tracer()
    if tracer is None:
        return _OFF
    return tracer.start_as_current_span(
        f"step {info.name}",
        attributes={
            "fairlane.workflow.run_id": info.run_id,
            "fairlane.step.name": info.name,
            "fairlane.step.attempt": info.attempt,
        },
    )


# -- the worker's hooks -----------------------------------------------------------------


class TracingHooks(WorkerHooks):
    """A worker's spans: ``process`` around each attempt, ``step`` around each workflow
    step that runs, ``send`` around the children a run starts."""

    def __init__(self, tasks: Mapping[str, TaskDefinition[Any, Any]]) -> None:
        self._tasks = tasks

    def attempt(self, job: FetchedJob) -> Attempt | None:
        """Open and make current the ``process`` span of one attempt (None: tracing is off)."""
        tracer = active_tracer()
        if tracer is None:
            return None
        task = self._tasks.get(job.task)
        lane = task.options.lane if task is not None else "unknown"
        wait_ms = max(0, time.time_ns() // 1_000_000 - job.enqueued_ms)
        span = tracer.start_span(
            f"process {lane}",
            context=_extract(job.trace_context),
            kind=_trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": lane,
                "messaging.message.id": job.id,
                "messaging.fairlane.queue_wait_ms": wait_ms,
                "fairlane.task": job.task,
                "fairlane.tenant": job.tenant,
                "fairlane.class": job.service_class,
                "fairlane.attempt": job.attempt,
                "fairlane.max_attempts": job.max_attempts,
            },
        )
        # a Token[Context], which opentelemetry-api typed as `object` before 1.31
        token: Token[OtelContext] = cast(
            Any, _otel_context.attach(_trace.set_span_in_context(span))
        )
        return Attempt(span, token)

    def step(self, info: StepInfo) -> AbstractContextManager[Span | None]:
        return step_span(info)

    def sending(self, lane: str, jobs: Sequence[NewJob]) -> AbstractContextManager[Span | None]:
        return sending(lane, jobs)
