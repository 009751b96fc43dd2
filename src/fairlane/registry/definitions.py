"""What was declared of one task, and of one cron entry.

A ``TaskDefinition`` is what a worker needs of a task -- its name, function, options,
argument codec and, for a workflow, its shape -- and what every path that enqueues
it needs to make its jobs (``encode_args``, and ``new_job`` of a call's
``CallOptions``). The task handle users hold (``fairlane.app.task.Task``) is a
definition with the app's enqueue methods on top.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Generic, ParamSpec, TypeVar

from cronsim import CronSim, CronSimError

from fairlane.codec import ArgsCodec, PayloadTooLarge
from fairlane.registry.calls import CallOptions, Placement
from fairlane.registry.jobs import Demand, JobFactory, new_job_id
from fairlane.registry.options import TaskOptions, WorkflowOptions
from fairlane.store.wire import NewJob

__all__ = ["CronEntry", "TaskDefinition"]

P = ParamSpec("P")
R = TypeVar("R")


class TaskDefinition(Generic[P, R]):
    """A task as declared: the function, its options and codec, and how its jobs are made."""

    def __init__(
        self,
        factory: JobFactory,
        fn: Callable[P, Awaitable[R]] | Callable[P, R],
        options: TaskOptions,
        workflow: WorkflowOptions | None = None,
    ) -> None:
        self.factory = factory
        self.fn = fn
        self.options = options
        #: how a workflow's runs are sliced (None: a plain task)
        self.workflow = workflow
        # a workflow's Context is the worker's to give: callers pass the arguments after it
        self.codec = ArgsCodec(
            fn, skip_first=workflow is not None, drop_unknown=options.unknown_kwargs == "drop"
        )
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

    def encode_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        blob = self.codec.encode(args, kwargs)
        payloads = self.factory.payloads
        if payloads is not None and payloads.by_reference(blob):
            # it travels as a reference: the server's limit applies to that, not to this
            payloads.check_size(blob, f"arguments of {self.name}")
            return blob
        limit = self.factory.max_payload_bytes
        if len(blob) > limit:
            raise PayloadTooLarge(
                f"arguments of {self.name} are {len(blob)} bytes, over the {limit}-byte limit "
                "(max_payload_bytes)"
            )
        return blob

    def new_job(self, blob: bytes, call: CallOptions) -> NewJob:
        """One job of this task, every option of ``call`` checked (``blob`` from
        ``encode_args``)."""
        when, demand = self.factory.plan(self.options, call)
        return self.job(blob, when, demand, call.idempotency_key or "")

    def has_class(self, service_class: str) -> bool:
        """Whether this task's lane has ``service_class`` in its class table."""
        return service_class in self.factory.lane_tables.table(self.options.lane)

    def job(self, blob: bytes, when: Placement, demand: Demand, idempotency_key: str) -> NewJob:
        """The ``NewJob`` of a checked placement and demand."""
        return NewJob(
            self.factory.shards.id_prefix(when.shard) + new_job_id(),
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
            limits=demand.wire_limits(),
            rates=demand.wire_rates(),
            rate_mu=demand.rate_mu,
            declared_mu=demand.declared_mu,
            cost_key=demand.cost_key,
            declared=int(demand.declared),
            fairness_key=when.fairness_key,
            class_named=int(demand.class_named),
            deadline_order=int(self.options.deadline_order),
        )


class CronEntry:
    """A task enqueued once per tick of a cron schedule, across any number of workers."""

    def __init__(self, schedule: str, task: TaskDefinition[[], Any]) -> None:
        try:
            CronSim(schedule, datetime.now(UTC))
        except CronSimError as exc:
            raise ValueError(f"bad cron schedule {schedule!r}: {exc}") from None
        self.schedule = schedule
        self.task = task
