"""``Task``: a registered function as users hold it, enqueued by name.

A task handle is its declaration (``fairlane.registry.TaskDefinition``: function,
options, codec, job construction) with the app's producer side on top: ``enqueue``,
``submit`` and ``enqueue_many``. Each binds the call to the function's signature and
checks argument types at the call site; everything it sends is validated before one
byte is written, so a bad call never leaves a half-stored job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Generic, ParamSpec, TypedDict, TypeVar, Unpack

import msgspec

from fairlane import tracing
from fairlane.app.admission import (
    CLASS_NOT_ENTITLED,
    DEADLINE_UNMEETABLE,
    STORE_BUSY,
    STORE_FULL,
    Admission,
    Rejected,
    answer,
    store_full,
    unavailable,
)
from fairlane.app.job import Job, TaskOwner
from fairlane.app.startestimate import OnUnmeetable, estimate_submission, refusing_late
from fairlane.config.lanes import LimitValue
from fairlane.config.settings import DurabilitySettings
from fairlane.errors import StoreFull
from fairlane.policy.admission import Estimate
from fairlane.policy.rates import Rate
from fairlane.registry import (
    CallOptions,
    Placement,
    Seconds,
    TaskDefinition,
    TaskOptions,
    WorkflowOptions,
    new_job_id,
)
from fairlane.registry.jobs import Demand
from fairlane.store.apikeys import KeyGuard
from fairlane.store.durability import NotAcknowledged
from fairlane.store.gate import StoreBusy
from fairlane.store.shards import submit
from fairlane.store.wire import NewJob, Reply, StoreError, StoreUnavailable

__all__ = ["BoundCall", "EnqueueOptions", "Task"]

P = ParamSpec("P")
R = TypeVar("R")


class Task(TaskDefinition[P, R]):
    """A function registered with an app, enqueued by name."""

    def __init__(
        self,
        app: TaskOwner,
        fn: Callable[P, Awaitable[R]] | Callable[P, R],
        options: TaskOptions,
        workflow: WorkflowOptions | None = None,
    ) -> None:
        super().__init__(app.registry.factory, fn, options, workflow)
        self.app = app

    def __repr__(self) -> str:
        return f"Task({self.name!r}, lane={self.options.lane!r})"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[R] | R:
        """Call the function directly, in this process (no queue)."""
        return self.fn(*args, **kwargs)

    def bind(self, *args: P.args, **kwargs: P.kwargs) -> BoundCall[R]:
        """A call checked statically against the signature; ``await .enqueue(tenant=...)``."""
        return BoundCall(self, args, kwargs)

    async def enqueue(
        self,
        *args: Any,
        tenant: str = "default",
        fairness_key: str | None = None,
        delay: Seconds | None = None,
        at: datetime | None = None,
        deadline: datetime | Seconds | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        service_class: str | None = None,
        slots: int | None = None,
        limits: Mapping[str, LimitValue] | None = None,
        rates: Mapping[str, Rate] | None = None,
        estimate: Estimate | float | None = None,
        trace: bool = True,
        durability: DurabilitySettings | None = None,
        on_unmeetable: OnUnmeetable = "reject",
        **kwargs: Any,
    ) -> Job[R]:
        """Enqueue one call. Arguments are checked against the signature here, at the call site.

        ``fairness_key`` names whose share of the tenant's part the job takes (an end
        user of the tenant): the tenant's keys share its part fairly, by their weights
        (``app.tenants.configure_key``); without one, the tenant's jobs run in arrival
        order. ``service_class`` and ``slots`` replace the task's; ``limits`` and ``rates`` are
        added to the task's (a key named by both takes this call's). A deferred job is returned
        like an accepted one; a rejection raises ``Rejected(reason, retry_after)``; a class
        the tenant is not entitled to, ``Rejected("class_not_entitled", None)`` (a
        restricted class, ``app.tenants.configure(tenant, classes=[...])``).
        ``trace=False`` stores no trace context with the job (``fairlane.tracing``).
        ``durability`` (default: the app's) asks replicas or AOF fsyncs to confirm the
        write; a job stored without that confirmation raises ``NotAcknowledged``.
        """
        call = CallOptions(
            tenant=tenant,
            fairness_key=fairness_key,
            delay=delay,
            at=at,
            deadline=deadline,
            idempotency_key=idempotency_key,
            priority=priority,
            service_class=service_class,
            slots=slots,
            limits=limits,
            rates=rates,
            estimate=estimate,
            trace=trace,
            durability=durability,
        )
        admission: Admission[R] = await self._submit(args, kwargs, call, on_unmeetable)
        if admission.job is not None:
            ack = admission.acknowledgement
            if ack is not None and not ack.met:
                raise NotAcknowledged([admission.job], ack)
            return admission.job
        if admission.reason == STORE_BUSY:
            raise StoreBusy(
                "every connection of this process stayed in use for connection.timeout; "
                "nothing was enqueued"
            )
        if admission.status == "unavailable":
            raise StoreUnavailable("the store cannot be reached; nothing was enqueued")
        if admission.reason == DEADLINE_UNMEETABLE:
            raise Rejected(DEADLINE_UNMEETABLE, None, estimated_start=admission.estimated_start)
        if admission.reason == CLASS_NOT_ENTITLED:
            raise Rejected(CLASS_NOT_ENTITLED, None)
        raise Rejected(admission.reason or "class_full", admission.retry_after or 1.0)

    async def submit(
        self,
        *args: Any,
        tenant: str = "default",
        fairness_key: str | None = None,
        service_class: str | None = None,
        estimate: Estimate | float | None = None,
        idempotency_key: str | None = None,
        deadline: datetime | Seconds | None = None,
        delay: Seconds | None = None,
        at: datetime | None = None,
        priority: int = 0,
        slots: int | None = None,
        limits: Mapping[str, LimitValue] | None = None,
        rates: Mapping[str, Rate] | None = None,
        trace: bool = True,
        durability: DurabilitySettings | None = None,
        on_unmeetable: OnUnmeetable = "reject",
        estimate_start: bool = False,
        **kwargs: Any,
    ) -> Admission[R]:
        """Ask admission to take one call: accepted, deferred (stored, admitted when room
        frees), rejected (with ``retry_after`` seconds and a reason) or unavailable.

        ``estimate`` is the work the call declares (an ``Estimate`` or units); the store
        reserves the larger of it and what this tenant's jobs of this workflow and model
        were learned to cost, times the safety multiplier. Bad input raises at once.
        With tracing on, a ``send`` span records the answer and, unless ``trace`` is
        False, the job stores its context for the workers' spans (``fairlane.tracing``).
        With ``durability`` (default: the app's), a stored job's ``acknowledgement``
        says what the replicas and AOF confirmed.
        With a ``deadline`` the job's start is estimated first (one read;
        ``fairlane.policy.startpredict``): one not expected to finish by it is rejected
        (``deadline_unmeetable``) unless ``on_unmeetable="accept"``. The answer's
        ``estimated_start`` holds the estimate, there and with ``estimate_start=True``.
        """
        call = CallOptions(
            tenant=tenant,
            fairness_key=fairness_key,
            delay=delay,
            at=at,
            deadline=deadline,
            idempotency_key=idempotency_key,
            priority=priority,
            service_class=service_class,
            slots=slots,
            limits=limits,
            rates=rates,
            estimate=estimate,
            trace=trace,
            durability=durability,
        )
        return await self._submit(args, kwargs, call, on_unmeetable, estimate_start)

    async def _submit(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        call: CallOptions,
        on_unmeetable: OnUnmeetable = "reject",
        estimate_start: bool = False,
    ) -> Admission[R]:
        """``submit`` of a call whose options are made already."""
        if on_unmeetable not in ("reject", "accept"):
            raise ValueError(f"on_unmeetable must be 'reject' or 'accept', got {on_unmeetable!r}")
        blob = self.encode_args(args, kwargs)
        job = self.new_job(blob, call)
        with tracing.sending(self.options.lane, [job], propagate=call.trace) as span:
            admission = await self.submit_job(
                job, call.durability, on_unmeetable=on_unmeetable, estimate_start=estimate_start
            )
            tracing.admitted(span, admission)
        return admission

    async def submit_job(
        self,
        job: NewJob,
        durability: DurabilitySettings | None = None,
        guard: KeyGuard | None = None,
        *,
        on_unmeetable: OnUnmeetable = "reject",
        estimate_start: bool = False,
    ) -> Admission[R]:
        """Submit a job made by ``new_job`` (as ``submit`` does, without a span);
        ``durability`` defaults to the app's. ``guard``: a gateway caller's key, which
        the enqueue checks in the same step (``KeyRefused`` if it no longer stands)."""
        app = self.app
        try:
            # the id names the tenant's shard: the tenant is hashed once, when the job is made
            store = app.sharded.store_for_job(job.id)
            start = None
            if job.deadline or estimate_start:
                start = await estimate_submission(store, job, self.options.lane)
                job = refusing_late(job, start, on_unmeetable)
            (reply,), ack = await submit(
                store, self.options.lane, [job], durability or app.registry.durability, guard
            )
        except StoreError as exc:
            return unavailable(exc)
        except StoreFull as full:
            return store_full(full, app.registry.pricing)
        handle: Job[R] | None = (
            Job(self, reply.id, created=reply.code in (1, 2)) if reply.code >= 0 else None
        )
        admission = answer(reply, handle, app.registry.pricing)
        if start is not None:
            admission = dataclasses.replace(admission, estimated_start=start.at)
        if ack is not None and admission.admitted:
            admission = dataclasses.replace(admission, acknowledgement=ack)
        return admission

    async def enqueue_many(
        self,
        calls: Iterable[Sequence[Any]],
        *,
        tenant: str = "default",
        fairness_key: str | None = None,
        delay: Seconds | None = None,
        at: datetime | None = None,
        deadline: datetime | Seconds | None = None,
        priority: int = 0,
        service_class: str | None = None,
        slots: int | None = None,
        limits: Mapping[str, LimitValue] | None = None,
        rates: Mapping[str, Rate] | None = None,
        estimate: Estimate | float | None = None,
        trace: bool = True,
        durability: DurabilitySettings | None = None,
    ) -> list[Job[R]]:
        """Enqueue many calls (each a tuple of positional arguments) in one round trip.

        Every call is checked before anything is sent: one bad call stores no job.
        The batch's jobs share ``tenant`` and ``fairness_key``.
        Admission judges each job on its own: if one is rejected, ``Rejected`` is raised
        and the batch's other jobs stay stored (``submit`` answers job by job); but a
        store with no room (``store_full``) refuses the whole batch, storing none of it.
        ``trace=False`` stores no trace context with the jobs (``fairlane.tracing``).
        """
        shared = CallOptions(
            tenant=tenant,
            fairness_key=fairness_key,
            delay=delay,
            at=at,
            deadline=deadline,
            priority=priority,
            service_class=service_class,
            slots=slots,
            limits=limits,
            rates=rates,
            estimate=estimate,
            trace=trace,
            durability=durability,
        )
        when, demand = self.factory.plan(self.options, shared)
        blobs = [self.encode_args(tuple(call), {}) for call in calls]
        if not blobs:
            return []
        jobs = self._batch(blobs, when, demand)
        # one span for the batch: every job of it carries the same context
        with tracing.sending(self.options.lane, jobs, propagate=shared.trace):
            durable = shared.durability or self.app.registry.durability
            return await self._store(jobs, when.shard, durable)

    def _batch(self, blobs: list[bytes], when: Placement, demand: Demand) -> list[NewJob]:
        """The jobs of one batch: the first made as every job is, the others copies of it
        with an id and arguments of their own. What the batch shares (placement, demand,
        the task's settings) is checked and put in wire form once, not once per job."""
        first = self.job(blobs[0], when, demand, "")
        prefix = self.factory.shards.id_prefix(when.shard)
        copy = msgspec.structs.replace
        return [
            first,
            *(copy(first, id=prefix + new_job_id(), args=blob.decode()) for blob in blobs[1:]),
        ]

    async def _store(
        self, jobs: list[NewJob], shard: int, durability: DurabilitySettings
    ) -> list[Job[R]]:
        store = self.app.sharded.stores[shard]  # a batch is one tenant's
        try:
            replies, ack = await submit(store, self.options.lane, jobs, durability)
        except StoreFull as full:
            # refused whole, before the script wrote any of it
            wait = self.app.registry.pricing.full_retry_after(full.depth)
            raise Rejected(STORE_FULL, wait) from full
        handles: list[Job[R]] = []
        for reply in replies:
            if reply.code == Reply.DEADLINE_UNMEETABLE:
                raise Rejected(DEADLINE_UNMEETABLE, None)
            if reply.code == Reply.REJECTED:
                # the others of the batch are stored: admission judges each job on its own
                reason = reply.reason or "class_full"
                retry = self.app.registry.pricing.retry_after(reply.earlier_rejections)
                raise Rejected(reason, retry)
            if reply.code == Reply.CLASS_NOT_ENTITLED:
                # a batch shares its tenant and class: none of it was stored
                raise Rejected(CLASS_NOT_ENTITLED, None)
            if reply.code < 0:
                raise ValueError(f"job {reply.id}: refused by the store (code {reply.code})")
            handles.append(Job(self, reply.id, created=reply.code in (1, 2)))
        if ack is not None and not ack.met:
            raise NotAcknowledged(list(handles), ack)
        return handles


class EnqueueOptions(TypedDict, total=False):
    """The options of ``Task.enqueue``, for calls that pass them along."""

    tenant: str
    fairness_key: str | None
    delay: Seconds | None
    at: datetime | None
    deadline: datetime | Seconds | None
    idempotency_key: str | None
    priority: int
    service_class: str | None
    slots: int | None
    limits: Mapping[str, LimitValue] | None
    rates: Mapping[str, Rate] | None
    estimate: Estimate | float | None
    trace: bool
    durability: DurabilitySettings | None
    on_unmeetable: OnUnmeetable


class BoundCall(Generic[R]):
    """A call of a task with its arguments bound, awaiting its enqueue options."""

    __slots__ = ("_args", "_kwargs", "_task")

    def __init__(self, task: Task[Any, R], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._task, self._args, self._kwargs = task, args, kwargs

    async def enqueue(self, **options: Unpack[EnqueueOptions]) -> Job[R]:
        return await self._task.enqueue(*self._args, **options, **self._kwargs)
