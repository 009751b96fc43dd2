"""What users declare and hold: ``Task`` (a registered function) and ``Job`` (one enqueued call).

``Task.enqueue`` binds the call to the function's signature and checks argument
types at the call site; everything it sends is validated before one byte is
written, so a bad call never leaves a half-stored job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, ParamSpec, TypedDict, TypeVar, Unpack

import msgspec

from fairlane import tracing
from fairlane.admission import (
    Admission,
    NotAcknowledged,
    Rejected,
    answer,
    cost_key,
    unavailable,
)
from fairlane.codec import ArgsCodec, PayloadTooLarge, decode_error
from fairlane.config.lanes import (
    DEFAULT_CLASS,
    check_lane,
    check_limits,
    check_service_class,
    check_slots,
    merge_limits,
)
from fairlane.config.settings import DurabilitySettings
from fairlane.errors import JobCancelled, JobExpired, JobNotFound, TaskFailed
from fairlane.policy.admission import Estimate
from fairlane.policy.backoff import Backoff
from fairlane.policy.retention import Retention
from fairlane.store.api import Store
from fairlane.store.durability import submit_acknowledged
from fairlane.store.fields import field_int, field_text
from fairlane.store.keys import shard_job_id
from fairlane.store.wire import NewJob, StoreUnavailable, Submitted

if TYPE_CHECKING:
    from fairlane.app import App

__all__ = ["BoundCall", "EnqueueOptions", "Job", "JobInfo", "Task", "TaskOptions"]

P = ParamSpec("P")
R = TypeVar("R")

Executor = Literal["async", "thread", "process"]
TERMINAL = frozenset({"completed", "failed", "cancelled", "expired"})
PRIORITY_LIMIT = 1000
Seconds = float | int | timedelta


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """A task's effective settings; ``defaults`` names those left at their default."""

    name: str
    lane: str
    attempts: int
    backoff: Backoff
    timeout: float | None
    retention: Retention
    executor: Executor
    retry_on: tuple[type[BaseException], ...]
    service_class: str = DEFAULT_CLASS
    slots: int = 1
    limits: tuple[tuple[str, int], ...] = ()
    """Throttle keys and limits every job of the task names, sorted by key."""
    tenant_slots: int | None = None
    """At most this many of one tenant's jobs of the task's lane run at once (a throttle
    key per lane and tenant, ``lane:<lane>:tenant:<tenant>``); None: no cap."""
    defaults: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        try:
            check_lane(self.lane)
            check_service_class(self.service_class)
            check_slots(self.slots)
            check_limits(dict(self.limits))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"task {self.name}: {exc}") from None
        if self.attempts < 1:
            raise ValueError(f"task {self.name}: attempts must be >= 1, got {self.attempts}")
        if self.tenant_slots is not None and (
            not isinstance(self.tenant_slots, int) or self.tenant_slots < 1
        ):
            raise ValueError(
                f"task {self.name}: tenant_slots must be an int >= 1, got {self.tenant_slots!r}"
            )
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"task {self.name}: timeout must be > 0, got {self.timeout}")
        if self.executor not in ("async", "thread", "process"):
            raise ValueError(f"task {self.name}: executor must be async, thread or process")


def _seconds(value: Seconds, what: str) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0:
        raise ValueError(f"{what} cannot be negative: {value!r}")
    return seconds


def _epoch_ms(moment: datetime, what: str) -> int:
    if moment.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware (e.g. datetime.now(UTC)): {moment!r}")
    return int(moment.timestamp() * 1000)


class _IdSource:
    """This process's part of job ids: 32 random bits, and a counter after them."""

    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        self.origin = random.getrandbits(32)
        self.counter = itertools.count(random.getrandbits(16))


_ids = _IdSource()
os.register_at_fork(after_in_child=_ids.reseed)


def new_job_id() -> str:
    """Time-ordered, unique without coordination: milliseconds, then 32 bits random per
    process, then a counter -- so that the ids one process makes in one millisecond
    sort in the order they were made (retention breaks ties of finish time by id)."""
    count = next(_ids.counter) & 0xFFFFFFFF
    return f"{time.time_ns() // 1_000_000:011x}{_ids.origin:08x}{count:08x}"


@dataclass(frozen=True, slots=True)
class _Placement:
    """Where and when jobs go, validated once per enqueue call (a batch shares it)."""

    tenant: str
    priority: int
    delay_ms: int | None
    at_ms: int | None
    deadline: str

    @classmethod
    def of(
        cls,
        tenant: str,
        delay: Seconds | None,
        at: datetime | None,
        deadline: datetime | Seconds | None,
        priority: int,
    ) -> _Placement:
        if not isinstance(tenant, str):
            raise TypeError(f"tenant must be a string, got {tenant!r}")
        if not tenant or len(tenant) > 200:
            raise ValueError(
                f"tenant must be a non-empty string of at most 200 characters: {tenant!r}"
            )
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an int, got {priority!r}")
        if not -PRIORITY_LIMIT <= priority <= PRIORITY_LIMIT:
            raise ValueError(f"priority must be within +-{PRIORITY_LIMIT}, got {priority}")
        if delay is not None and at is not None:
            raise ValueError("give either delay= or at=, not both")
        return cls(
            tenant=tenant,
            priority=priority,
            delay_ms=None if delay is None else round(_seconds(delay, "delay") * 1000),
            at_ms=None if at is None else _epoch_ms(at, "at"),
            deadline=_deadline(deadline),
        )


@dataclass(frozen=True, slots=True)
class _Demand:
    """What jobs ask of their lane: a service class, a width in slots, throttle limits."""

    service_class: str
    slots: int
    limits: list[tuple[str, int]]
    declared_mu: int
    """The caller's estimate in milli-units (the store may raise it to the learned cost)."""
    cost_key: str
    declared: bool

    @classmethod
    def of(  # noqa: PLR0917 - the demand's own parts
        cls,
        task: Task[Any, Any],
        service_class: str | None,
        slots: int | None,
        limits: Mapping[str, int] | None,
        tenant: str,
        estimate: Estimate | float | None = None,
    ) -> _Demand:
        options = task.options
        name = (
            options.service_class if service_class is None else check_service_class(service_class)
        )
        # checked here, not only by the store: a refused job must leave nothing behind
        task.app.lane_tables.check_class(options.lane, name)
        return cls(
            service_class=name,
            slots=options.slots if slots is None else check_slots(slots),
            limits=list(merge_limits(_tenant_cap(options, tenant), check_limits(limits))),
            declared_mu=task.app.pricing.declared_milli(estimate),
            cost_key=cost_key(tenant, task.name, estimate),
            declared=estimate is not None,
        )


def _tenant_cap(options: TaskOptions, tenant: str) -> tuple[tuple[str, int], ...]:
    """The task's limits, with its per-tenant cap on the lane when it has one."""
    if options.tenant_slots is None:
        return options.limits
    cap = {f"lane:{options.lane}:tenant:{tenant}": options.tenant_slots}
    return merge_limits(tuple(sorted(cap.items())), options.limits)


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A snapshot of a job's record."""

    id: str
    status: str
    task: str
    tenant: str
    attempts: int
    max_attempts: int
    enqueued_at: datetime | None
    finished_at: datetime | None
    error: str | None
    service_class: str = DEFAULT_CLASS
    slots: int = 1
    limits: dict[str, int] = field(default_factory=dict)
    reserved_units: float | None = None
    """Work units admission reserved for it, or will when a deferred job is admitted
    (None: its lane has no admission control)."""
    charged_units: float | None = None
    """Work units its tenant was charged at dispatch (when tenants are charged by cost)."""
    actual_units: float | None = None
    """Work units its last attempt used: reported usage, wall time counting as tool time."""
    waiting_for: str | None = None
    """What a suspended workflow run waits for (``yield``, ``sleep``, ``signal:<name>``,
    ``children``); None when it is not suspended."""


def _units(raw: bytes | None) -> float | None:
    try:
        return None if raw is None else int(float(raw)) / 1000
    except (ValueError, OverflowError):
        return None


_LIMITS = msgspec.msgpack.Decoder(list[tuple[str, int]])


def _limits(raw: bytes | None) -> dict[str, int]:
    if not raw:
        return {}
    try:
        return dict(_LIMITS.decode(raw))
    except msgspec.DecodeError:
        return {}


def _when(raw: bytes | None) -> datetime | None:
    try:
        return datetime.fromtimestamp(int(raw) / 1000, UTC) if raw else None
    except (ValueError, OverflowError, OSError):
        return None


class Job(Generic[R]):
    """A handle on one enqueued job."""

    __slots__ = ("_task", "created", "id")

    def __init__(self, task: Task[Any, R], job_id: str, *, created: bool = True) -> None:
        self._task = task
        self.id = job_id
        self.created = created  # False when an idempotency key matched an existing job

    def __repr__(self) -> str:
        return f"Job({self._task.name!r}, {self.id!r})"

    def _store(self) -> Store:
        return self._task.app.store_for_job(self.id)

    async def status(self) -> str:
        """queued, throttled (waiting for room on a throttle key), scheduled, running,
        completed, failed, cancelled or expired."""
        (st,) = await self._store().job_fields(self.id, "st")
        if st is None:
            raise JobNotFound(f"no record of job {self.id}")
        return st.decode()

    async def info(self) -> JobInfo:
        rec = await self._store().job_record(self.id)
        if not rec:
            raise JobNotFound(f"no record of job {self.id}")
        err = rec.get("err")
        status = field_text(rec.get("st"), "")
        return JobInfo(
            id=self.id,
            status=status,
            task=field_text(rec.get("task"), ""),
            tenant=field_text(rec.get("tenant"), ""),
            attempts=field_int(rec.get("att"), 0),
            max_attempts=field_int(rec.get("max"), 1),
            enqueued_at=_when(rec.get("enq")),
            finished_at=_when(rec.get("fin")),
            error=decode_error(err).message if err else None,
            service_class=field_text(rec.get("cls"), DEFAULT_CLASS),
            slots=field_int(rec.get("sl"), 1),
            limits=_limits(rec.get("lim")),
            reserved_units=_units(rec.get("emu") or rec.get("dmu")),
            charged_units=_units(rec.get("cu")),
            actual_units=_units(rec.get("amu")),
            waiting_for=field_text(rec.get("wf"), "") or None if status == "scheduled" else None,
        )

    async def cancel(self) -> str:
        """Cancel the job; returns the resulting status (``cancelling`` if it was running)."""
        return await self._store().cancel(self.id)

    async def result(self, timeout: float | None = None) -> R:
        """Wait for the job to finish and return its result, or raise its failure."""
        async with asyncio.timeout(timeout):
            status, res, err = await self._task.app.wait_finished(self.id)
        if status == "completed":
            if self._task.app.payloads is not None:  # a large result is fetched from its store
                res = await self._task.app.payloads.resolve(res)
            return self._task.codec.decode_result(res)  # type: ignore[no-any-return]
        info = decode_error(err)
        kind = {"cancelled": JobCancelled, "expired": JobExpired}.get(status, TaskFailed)
        raise kind(self.id, info.type, info.message, info.traceback)


class Task(Generic[P, R]):
    """A function registered with an app, enqueued by name."""

    def __init__(
        self, app: App, fn: Callable[P, Awaitable[R]] | Callable[P, R], options: TaskOptions
    ):
        self.app = app
        self.fn = fn
        self.options = options
        self.codec = ArgsCodec(fn)
        # encoded once: every job of the task carries the same settings
        self._backoff = options.backoff.encode()
        self._timeout = options.timeout or 0.0
        self._keep_completed = options.retention.completed.encode()
        self._keep_failed = options.retention.failed.encode()
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    @property
    def name(self) -> str:
        return self.options.name

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
        delay: Seconds | None = None,
        at: datetime | None = None,
        deadline: datetime | Seconds | None = None,
        idempotency_key: str | None = None,
        priority: int = 0,
        service_class: str | None = None,
        slots: int | None = None,
        limits: Mapping[str, int] | None = None,
        estimate: Estimate | float | None = None,
        trace: bool = True,
        durability: DurabilitySettings | None = None,
        **kwargs: Any,
    ) -> Job[R]:
        """Enqueue one call. Arguments are checked against the signature here, at the call site.

        ``service_class`` and ``slots`` replace the task's; ``limits`` are added to the
        task's (a key named by both takes this call's limit). A deferred job is returned
        like an accepted one; a rejection raises ``Rejected(reason, retry_after)``.
        ``trace=False`` stores no trace context with the job (``fairlane.tracing``).
        ``durability`` (default: the app's) asks replicas or AOF fsyncs to confirm the
        write; a job stored without that confirmation raises ``NotAcknowledged``.
        """
        admission: Admission[R] = await self.submit(
            *args,
            tenant=tenant,
            service_class=service_class,
            estimate=estimate,
            idempotency_key=idempotency_key,
            deadline=deadline,
            delay=delay,
            at=at,
            priority=priority,
            slots=slots,
            limits=limits,
            trace=trace,
            durability=durability,
            **kwargs,
        )
        if admission.job is not None:
            ack = admission.acknowledgement
            if ack is not None and not ack.met:
                raise NotAcknowledged([admission.job], ack)
            return admission.job
        if admission.status == "unavailable":
            raise StoreUnavailable("the store cannot be reached; nothing was enqueued")
        if admission.reason == "deadline_unmeetable":
            raise ValueError("the job's deadline has already passed (server time)")
        raise Rejected(admission.reason or "class_full", admission.retry_after or 1.0)

    async def submit(
        self,
        *args: Any,
        tenant: str = "default",
        service_class: str | None = None,
        estimate: Estimate | float | None = None,
        idempotency_key: str | None = None,
        deadline: datetime | Seconds | None = None,
        delay: Seconds | None = None,
        at: datetime | None = None,
        priority: int = 0,
        slots: int | None = None,
        limits: Mapping[str, int] | None = None,
        trace: bool = True,
        durability: DurabilitySettings | None = None,
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
        """
        blob = self.encode_args(args, kwargs)
        job = self.new_job(
            blob,
            tenant=tenant,
            delay=delay,
            at=at,
            deadline=deadline,
            idempotency_key=idempotency_key,
            priority=priority,
            service_class=service_class,
            slots=slots,
            limits=limits,
            estimate=estimate,
        )
        with tracing.sending(self.options.lane, [job], propagate=trace) as span:
            admission = await self.submit_job(job, durability)
            tracing.admitted(span, admission)
        return admission

    async def submit_job(
        self, job: NewJob, durability: DurabilitySettings | None = None
    ) -> Admission[R]:
        """Submit a job made by ``new_job`` (as ``submit`` does, without a span);
        ``durability`` defaults to the app's."""
        durability = durability or self.app.durability
        try:
            store = self.app.store_for_tenant(job.tenant)
            if durability.requested:
                (reply,), ack = await submit_acknowledged(
                    store, self.options.lane, [job], durability
                )
            else:
                (reply,), ack = await store.submit(self.options.lane, [job]), None
        except StoreUnavailable:
            return unavailable()
        handle = Job(self, reply.id, created=reply.code in (1, 2)) if reply.code >= 0 else None
        admission = answer(reply, handle, self.app.pricing)
        if ack is not None and admission.admitted:
            admission = dataclasses.replace(admission, acknowledgement=ack)
        return admission

    async def enqueue_many(
        self,
        calls: Iterable[Sequence[Any]],
        *,
        tenant: str = "default",
        delay: Seconds | None = None,
        at: datetime | None = None,
        deadline: datetime | Seconds | None = None,
        priority: int = 0,
        service_class: str | None = None,
        slots: int | None = None,
        limits: Mapping[str, int] | None = None,
        estimate: Estimate | float | None = None,
        trace: bool = True,
        durability: DurabilitySettings | None = None,
    ) -> list[Job[R]]:
        """Enqueue many calls (each a tuple of positional arguments) in one round trip.

        Every call is checked before anything is sent: one bad call stores no job.
        Admission judges each job on its own: if one is rejected, ``Rejected`` is raised
        and the batch's other jobs stay stored (``submit`` answers job by job).
        ``trace=False`` stores no trace context with the jobs (``fairlane.tracing``).
        """
        when = _Placement.of(tenant, delay, at, deadline, priority)
        demand = _Demand.of(self, service_class, slots, limits, when.tenant, estimate)
        jobs = [self._job(self.encode_args(tuple(call), {}), when, demand, "") for call in calls]
        if not jobs:
            return []
        # one span for the batch: every job of it carries the same context
        with tracing.sending(self.options.lane, jobs, propagate=trace):
            return await self._store(jobs, durability or self.app.durability)

    def encode_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        blob = self.codec.encode(args, kwargs)
        payloads = self.app.payloads
        if payloads is not None and payloads.by_reference(blob):
            # it travels as a reference: the server's limit applies to that, not to this
            payloads.check_size(blob, f"arguments of {self.name}")
            return blob
        limit = self.app.settings.max_payload_bytes
        if len(blob) > limit:
            raise PayloadTooLarge(
                f"arguments of {self.name} are {len(blob)} bytes, over the {limit}-byte limit "
                "(max_payload_bytes)"
            )
        return blob

    def new_job(
        self,
        blob: bytes,
        *,
        tenant: str,
        delay: Seconds | None,
        at: datetime | None,
        deadline: datetime | Seconds | None,
        idempotency_key: str | None,
        priority: int,
        service_class: str | None = None,
        slots: int | None = None,
        limits: Mapping[str, int] | None = None,
        estimate: Estimate | float | None = None,
    ) -> NewJob:
        when = _Placement.of(tenant, delay, at, deadline, priority)
        demand = _Demand.of(self, service_class, slots, limits, when.tenant, estimate)
        return self._job(blob, when, demand, idempotency_key or "")

    def _job(self, blob: bytes, when: _Placement, demand: _Demand, idempotency_key: str) -> NewJob:
        app = self.app
        return NewJob(
            shard_job_id(new_job_id(), app.shard_of(when.tenant), app.shards),
            when.tenant,
            when.priority,
            self.name,
            blob.decode(),
            self.options.attempts,
            self._backoff,
            self._timeout,
            self._keep_completed,
            self._keep_failed,
            idempotency_key,
            when.delay_ms,
            when.at_ms,
            when.deadline,
            service_class=demand.service_class,
            slots=demand.slots,
            limits=demand.limits,
            declared_mu=demand.declared_mu,
            cost_key=demand.cost_key,
            declared=int(demand.declared),
        )

    async def _store(self, jobs: list[NewJob], durability: DurabilitySettings) -> list[Job[R]]:
        replies: list[Submitted]
        store = self.app.store_for_tenant(jobs[0].tenant)  # a batch is one tenant's
        if durability.requested:
            replies, ack = await submit_acknowledged(store, self.options.lane, jobs, durability)
        else:
            replies, ack = await store.submit(self.options.lane, jobs), None
        handles: list[Job[R]] = []
        for reply in replies:
            if reply.code == -1:
                raise ValueError(f"job {reply.id}: its deadline has already passed (server time)")
            if reply.code == -4:
                # the others of the batch are stored: admission judges each job on its own
                reason = reply.reason or "class_full"
                raise Rejected(reason, self.app.pricing.retry_after(reply.earlier_rejections))
            if reply.code < 0:
                raise ValueError(f"job {reply.id}: refused by the store (code {reply.code})")
            handles.append(Job(self, reply.id, created=reply.code in (1, 2)))
        if ack is not None and not ack.met:
            raise NotAcknowledged(list(handles), ack)
        return handles


def _deadline(deadline: datetime | Seconds | None) -> str:
    if deadline is None:
        return ""
    if isinstance(deadline, datetime):
        ms = _epoch_ms(deadline, "deadline")
        if ms <= time.time() * 1000:
            raise ValueError(f"the deadline is in the past: {deadline.isoformat()}")
        return str(ms)
    seconds = _seconds(deadline, "deadline")
    if seconds == 0:
        raise ValueError("a deadline of 0 seconds has already passed")
    return f"+{round(seconds * 1000)}"


class EnqueueOptions(TypedDict, total=False):
    """The options of ``Task.enqueue``, for calls that pass them along."""

    tenant: str
    delay: Seconds | None
    at: datetime | None
    deadline: datetime | Seconds | None
    idempotency_key: str | None
    priority: int
    service_class: str | None
    slots: int | None
    limits: Mapping[str, int] | None
    trace: bool
    durability: DurabilitySettings | None


class BoundCall(Generic[R]):
    """A call of a task with its arguments bound, awaiting its enqueue options."""

    __slots__ = ("_args", "_kwargs", "_task")

    def __init__(self, task: Task[Any, R], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._task, self._args, self._kwargs = task, args, kwargs

    async def enqueue(self, **options: Unpack[EnqueueOptions]) -> Job[R]:
        return await self._task.enqueue(*self._args, **options, **self._kwargs)
