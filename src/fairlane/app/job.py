"""``Job``: a handle on one enqueued job, and ``JobInfo``, a snapshot of its record.

A handle reads the job's record from the shard its id names, through the store's read
model (``fairlane.store.records.JobRecord``), and waits for its result through the
app's result listener, without polling (``fairlane.app.results``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Generic, Protocol, TypeVar

import msgspec

from fairlane.app.missing import job_not_found
from fairlane.app.startestimate import StartEstimate, start_estimate
from fairlane.codec import ArgsCodec, decode_error
from fairlane.config.lanes import DEFAULT_CLASS
from fairlane.errors import JobCancelled, JobExpired, JobNotFound, TaskFailed
from fairlane.registry import Registry
from fairlane.store.api import Store
from fairlane.store.records import STATUS
from fairlane.store.shards import ShardedStores

__all__ = ["TERMINAL", "Job", "JobInfo", "TaskOwner"]

R = TypeVar("R")

TERMINAL = frozenset({"completed", "failed", "cancelled", "expired"})


class TaskOwner(Protocol):
    """What a task handle and its jobs use of the app they belong to."""

    @property
    def registry(self) -> Registry: ...

    @property
    def sharded(self) -> ShardedStores: ...

    def wait_finished(self, job_id: str) -> Awaitable[tuple[str, bytes, bytes]]: ...


class _Owned(Protocol):
    """What a job handle uses of its task."""

    @property
    def name(self) -> str: ...

    @property
    def codec(self) -> ArgsCodec: ...

    @property
    def app(self) -> TaskOwner: ...


class JobInfo(msgspec.Struct, frozen=True):
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
    limits: dict[str, int] = msgspec.field(default_factory=dict)
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
    fairness_key: str | None = None
    """The end user of its tenant it was enqueued for (None: no fairness key)."""
    not_before: datetime | None = None
    """The earliest its current or next attempt may start: when it was enqueued, the end
    of its delay, or of the backoff before a retry (its last attempt's, once finished)."""
    deadline: datetime | None = None
    """Past this time it expires instead of running (None: no deadline)."""
    idempotency_key: str | None = None
    """The key a repeated submission names it by (None: none was given)."""
    estimated_start: datetime | None = None
    """When a waiting job (queued or scheduled) is expected to start: an estimate, not a
    promise (``job.start_estimate()`` gives its basis); None once it started, or where
    nothing can be said."""


def _units(mu: int | None) -> float | None:
    return None if mu is None else mu / 1000


def _when(ms: int | None) -> datetime | None:
    try:
        return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)
    except (ValueError, OverflowError, OSError):
        return None


class Job(Generic[R]):
    """A handle on one enqueued job."""

    __slots__ = ("_task", "created", "id")

    def __init__(self, task: _Owned, job_id: str, *, created: bool = True) -> None:
        self._task = task
        self.id = job_id
        self.created = created  # False when an idempotency key matched an existing job

    def __repr__(self) -> str:
        return f"Job({self._task.name!r}, {self.id!r})"

    def _store(self) -> Store:
        return self._task.app.sharded.store_for_job(self.id)

    async def status(self) -> str:
        """queued, throttled (waiting for room on a throttle key), scheduled, running,
        completed, failed, cancelled or expired."""
        record = await self._store().read_job(self.id, STATUS)
        if record is None:
            raise await self._missing()
        return record.status

    async def info(self, *, estimate: bool = True) -> JobInfo:
        """The job's record; a waiting one's ``estimated_start`` too (one more read),
        unless ``estimate`` is False (a caller that reads ``start_estimate()`` itself)."""
        rec = await self._store().read_job(self.id)
        if rec is None:
            raise await self._missing()
        failure = rec.failure
        start = None
        if estimate and rec.status in ("queued", "scheduled"):
            start = (await self.start_estimate()).at
        return JobInfo(
            id=self.id,
            status=rec.status,
            task=rec.task,
            tenant=rec.tenant,
            attempts=rec.attempts,
            max_attempts=1 if rec.max_attempts is None else rec.max_attempts,
            enqueued_at=_when(rec.enqueued_ms),
            finished_at=_when(rec.finished_ms),
            error=failure.message if failure else None,
            service_class=rec.service_class,
            slots=rec.slots,
            limits=rec.limits,
            reserved_units=_units(rec.reserved_mu),
            charged_units=_units(rec.charged_mu),
            actual_units=_units(rec.used_mu),
            waiting_for=rec.waiting_for or None if rec.status == "scheduled" else None,
            fairness_key=rec.fairness_key or None,
            not_before=_when(rec.run_ms),
            deadline=_when(rec.deadline_ms),
            idempotency_key=rec.idempotency_key or None,
            estimated_start=start,
        )

    async def start_estimate(self) -> StartEstimate:
        """When this job is expected to start, and what that rests on (one read;
        ``fairlane.policy.startpredict`` states the rule and its error model)."""
        return start_estimate(await self._store().estimate_job(self.id))

    async def _missing(self) -> JobNotFound:
        task = self._task.app.registry.tasks.get(self._task.name)
        retention = None if task is None else task.options.retention
        return await job_not_found(self._store(), self.id, retention)

    async def cancel(self) -> str:
        """Cancel the job; returns the resulting status (``cancelling`` if it was running)."""
        return await self._store().cancel(self.id)

    async def result(self, timeout: float | None = None) -> R:
        """Wait for the job to finish and return its result, or raise its failure."""
        app = self._task.app
        try:
            async with asyncio.timeout(timeout):
                status, res, err = await app.wait_finished(self.id)
        except JobNotFound:
            raise await self._missing() from None
        if status == "completed":
            payloads = app.registry.payloads
            if payloads is not None:  # a large result is fetched from its store
                res = await payloads.resolve(res)
            return self._task.codec.decode_result(res)  # type: ignore[no-any-return]
        info = decode_error(err)
        kind = {"cancelled": JobCancelled, "expired": JobExpired}.get(status, TaskFailed)
        raise kind(self.id, info.type, info.message, info.traceback)
