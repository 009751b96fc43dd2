"""The declaring half of an ``App``: ``@app.task``, ``@app.workflow``, ``@app.cron``, ``app.lane``.

Each decorator checks what it is given against what the app declared before and
records it in the app's ``Registry`` (``fairlane.registry``), where the worker reads
it; the object it returns is the task handle users enqueue with. ``App`` adds the
connection, the result listener, the admin operations and the worker on top.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, ParamSpec, Protocol, TypeVar, cast, overload

from fairlane.app.task import Task
from fairlane.app.workflows import Workflow, WorkflowFunction, WorkflowOptions
from fairlane.config.lanes import LaneClasses, LaneTables, LimitValue
from fairlane.config.pools import FairlaneConfig
from fairlane.config.settings import DurabilitySettings, Settings
from fairlane.payloads.offload import Payloads
from fairlane.policy.backoff import Backoff
from fairlane.policy.classes import ClassTable
from fairlane.policy.rates import Rate
from fairlane.policy.retention import Retention
from fairlane.registry import UNSET, CronEntry, Executor, Pricing, Registry, UnknownKwargs
from fairlane.registry.naming import default_name
from fairlane.store.shards import ShardedStores

__all__ = ["Declaring", "TaskDecorator"]

P = ParamSpec("P")
R = TypeVar("R")


class TaskDecorator(Protocol):
    """Turns a function into a task; an async function's task returns what it awaits."""

    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]], /) -> Task[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...


class Declaring(ABC):
    """Declarations of an app, recorded in its ``registry``."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    # what the task handles made here use of the connected app
    @property
    @abstractmethod
    def sharded(self) -> ShardedStores: ...

    @abstractmethod
    async def wait_finished(self, job_id: str) -> tuple[str, bytes, bytes]: ...

    # -- the registry's parts, as the app shows them ---------------------------------

    @property
    def settings(self) -> Settings:
        return self.registry.settings

    @property
    def shards(self) -> int:
        """Scheduling shards, each a whole scheduler under its own hash tag; tenants are
        spread over them by a stable hash (``fairlane.policy.shards``)."""
        return self.registry.shards

    @property
    def durability(self) -> DurabilitySettings:
        """What every enqueue waits for replicas or AOF fsyncs to confirm, unless the
        call says otherwise."""
        return self.registry.durability

    @property
    def tasks(self) -> dict[str, Task[Any, Any]]:
        # the registry holds exactly the handles made here
        return cast("dict[str, Task[Any, Any]]", self.registry.tasks)

    @property
    def crons(self) -> dict[str, CronEntry]:
        return self.registry.crons

    @property
    def lane_tables(self) -> LaneTables:
        return self.registry.lane_tables

    @property
    def config(self) -> FairlaneConfig:
        """Pools (lanes with admission control), retry and estimation settings."""
        return self.registry.config

    @property
    def charge(self) -> Literal["jobs", "cost"]:
        """How tenants are charged for fair shares: one unit per job, or what jobs cost."""
        return self.registry.charge

    @property
    def pricing(self) -> Pricing:
        return self.registry.pricing

    @property
    def payloads(self) -> Payloads | None:
        """The payload store large arguments and results go to; None keeps them in the
        server."""
        return self.registry.payloads

    # -- declaring -------------------------------------------------------------------

    def lane(self, name: str, *, classes: LaneClasses) -> ClassTable:
        """Declare a lane's service classes (a lane not declared uses ``DEFAULT_CLASSES``)."""
        return self.registry.lane(name, classes, source="app.lane()")

    @property
    def lanes(self) -> dict[str, ClassTable]:
        """The lanes declared on this app, with their class tables."""
        return self.registry.lanes

    def lane_classes(self, lane: str) -> ClassTable:
        """The class table jobs of ``lane`` are dispatched by: as declared, else the default."""
        return self.registry.lane_classes(lane)

    def get_task(self, name: str) -> Task[Any, Any]:
        return cast("Task[Any, Any]", self.registry.get(name))

    @overload
    def task(self, fn: Callable[P, Awaitable[R]], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        lane: str | None = None,
        attempts: int = ...,
        backoff: Backoff = ...,
        timeout: float | None = ...,
        retention: Retention = ...,
        executor: Executor = ...,
        retry_on: Sequence[type[BaseException]] = ...,
        service_class: str = ...,
        slots: int = ...,
        limits: Mapping[str, LimitValue] | None = ...,
        rates: Mapping[str, Rate] | None = ...,
        tenant_slots: int | None = ...,
        unknown_kwargs: UnknownKwargs = ...,
        gateway: bool = ...,
        deadline_order: bool = ...,
    ) -> TaskDecorator: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        lane: str | None = None,
        attempts: Any = UNSET,
        backoff: Any = UNSET,
        timeout: Any = UNSET,
        retention: Any = UNSET,
        executor: Any = UNSET,
        retry_on: Any = UNSET,
        service_class: Any = UNSET,
        slots: Any = UNSET,
        limits: Any = UNSET,
        rates: Any = UNSET,
        tenant_slots: int | None = None,
        unknown_kwargs: Any = UNSET,
        gateway: bool = False,
        deadline_order: bool = False,
    ) -> Any:
        """Register a function as a task. Every option left out is marked as a default.

        ``name`` is what producers store and workers look up: by default
        ``<module>.<qualname>`` (a function of a script run as ``__main__`` is named after
        the module a worker imports, with a ``TaskNameWarning``). ``service_class``,
        ``slots``, ``limits`` (concurrency keys: an int or an ``Adaptive``) and ``rates``
        (rate keys: a ``Rate``) are the defaults of the task's jobs; each enqueue may
        change them. ``tenant_slots`` caps how many of one tenant's jobs of the task's lane
        run at once. ``unknown_kwargs="drop"`` runs a job whose stored arguments include
        one the function does not take (a newer producer's) without it; by default
        ("refuse") the worker hands such a job back for one whose function takes it.
        ``gateway=True`` lets tenants call the task over the HTTP gateway; a task is
        private to the platform's own code unless it says so. ``deadline_order=True``
        runs its jobs given a ``deadline=`` earliest deadline first among their tenant's
        own jobs of the same priority (ahead of those with a later deadline or none);
        other tenants' turns do not change. Off by default: priority, then arrival order.
        """
        given: dict[str, Any] = {
            "attempts": attempts,
            "backoff": backoff,
            "timeout": timeout,
            "retention": retention,
            "executor": executor,
            "retry_on": retry_on,
            "service_class": service_class,
            "slots": slots,
            "limits": limits,
            "rates": rates,
            "unknown_kwargs": unknown_kwargs,
        }

        def register(func: Callable[..., Any]) -> Task[Any, Any]:
            options = self.registry.options(
                func,
                name,
                lane,
                given,
                tenant_slots,
                gateway=gateway,
                deadline_order=deadline_order,
            )
            self.registry.check_function(func, options)
            task: Task[Any, Any] = Task(self, func, options)
            self.registry.add(task)
            return task

        return register(fn) if fn is not None else register

    def workflow(
        self,
        *,
        name: str | None = None,
        lane: str | None = None,
        slice_seconds: float = 2.0,
        slice_steps: int = 20,
        max_children: int = 10,
        tenant_slots: int | None = None,
        attempts: int = UNSET,
        backoff: Backoff = UNSET,
        timeout: float | None = UNSET,
        retention: Retention = UNSET,
        retry_on: Sequence[type[BaseException]] = UNSET,
        service_class: str = UNSET,
        limits: Mapping[str, LimitValue] | None = UNSET,
        rates: Mapping[str, Rate] | None = UNSET,
        unknown_kwargs: UnknownKwargs = UNSET,
        gateway: bool = False,
    ) -> Callable[[WorkflowFunction[P, R]], Workflow[P, R]]:
        """Register a durable workflow: ``async def fn(ctx: Context, ...)``.

        Each lease of a run is a slice: it replays the run's checkpoints, then goes on
        until the run finishes or waits, or until ``slice_steps`` new steps or
        ``slice_seconds`` are spent; then the run gives its slot back and re-enters
        fair dispatch as its tenant's work. ``attempts`` is the run's budget for
        failed or reclaimed slices (a slice that yields or waits does not count);
        ``timeout`` bounds one slice. ``tenant_slots`` caps the runs one tenant has
        running in the lane at once; ``max_children`` caps one run's running children.
        ``gateway=True`` lets tenants start runs over the HTTP gateway, as for a task.
        """
        shape = WorkflowOptions(slice_seconds, slice_steps, max_children)
        given: dict[str, Any] = {
            "attempts": attempts,
            "backoff": backoff,
            "timeout": timeout,
            "retention": retention,
            "executor": "async",
            "retry_on": retry_on,
            "service_class": service_class,
            "slots": 1,
            "limits": limits,
            "rates": rates,
            "unknown_kwargs": unknown_kwargs,
        }

        def register(func: WorkflowFunction[P, R]) -> Workflow[P, R]:
            params = list(inspect.signature(func).parameters.values())
            if not params or params[0].kind not in (
                inspect.Parameter.POSITIONAL_ONLY,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
            ):
                raise ValueError(
                    f"workflow {func.__qualname__} must take the run's Context as its first "
                    "positional parameter"
                )
            options = self.registry.options(
                func, name, lane, given, tenant_slots, decorator="app.workflow(", gateway=gateway
            )
            flow: Workflow[P, R] = Workflow(self, func, options, shape)
            self.registry.check_function(func, options)
            self.registry.add(flow)
            return flow

        return register

    def cron(
        self,
        schedule: str,
        *,
        name: str | None = None,
        lane: str | None = None,
        attempts: int = 1,
        timeout: float | None = UNSET,
        executor: Executor = UNSET,
        service_class: str = UNSET,
        slots: int = UNSET,
        limits: Mapping[str, LimitValue] | None = UNSET,
        rates: Mapping[str, Rate] | None = UNSET,
    ) -> Callable[[Callable[[], Any]], Task[[], Any]]:
        """Run a no-argument function once per tick of ``schedule`` (5-field cron, UTC)."""

        def register(func: Callable[[], Any]) -> Task[[], Any]:
            try:  # each tick enqueues a call without arguments
                inspect.signature(func).bind()
            except TypeError:
                raise ValueError(
                    f"cron task {func.__qualname__} must be callable without arguments"
                ) from None
            task = self.task(
                name=name or default_name(func, f"app.cron({schedule!r}, ", prefix="cron:"),
                lane=lane,
                attempts=attempts,
                timeout=timeout,
                executor=executor,
                service_class=service_class,
                slots=slots,
                limits=limits,
                rates=rates,
                # a tick's job is kept (and so deduplicated) for a day
                retention=Retention(completed="1d", failed="7d"),
            )(func)
            self.registry.add_cron(schedule, task)
            return task

        return register
