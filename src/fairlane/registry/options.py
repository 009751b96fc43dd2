"""A task's options and a workflow's shape, checked when they are declared.

``TaskOptions`` are a task's effective settings (what ``app.task(...)`` was given, the
app's defaults for the rest), ``UnknownKwargs`` what a worker does with stored arguments
its function does not take; ``WorkflowOptions`` how a workflow's runs are sliced
and fanned out. ``TASK_DEFAULTS`` are the defaults before an app's config changes
them, and ``RESERVED_PARAMETERS`` the names a task's function may not use, being
those of the enqueue options.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from fairlane.config.lanes import DEFAULT_CLASS, LimitValue, check_lane
from fairlane.policy.backoff import Backoff
from fairlane.policy.rates import Rate
from fairlane.policy.retention import Retention
from fairlane.registry.calls import (
    check_key_count,
    check_limits,
    check_rates,
    check_service_class,
    check_slots,
)

__all__ = [
    "RESERVED_PARAMETERS",
    "TASK_DEFAULTS",
    "Executor",
    "TaskOptions",
    "UnknownKwargs",
    "WorkflowOptions",
]

Executor = Literal["async", "thread", "process"]
#: A stored argument the worker's function does not take (a newer producer's, during a
#: rolling deploy): "refuse" hands the job back for a worker whose function takes it,
#: until the deploy window ends; "drop" calls the function without it.
UnknownKwargs = Literal["refuse", "drop"]

RESERVED_PARAMETERS = frozenset(
    {
        "tenant",
        "fairness_key",
        "delay",
        "at",
        "deadline",
        "idempotency_key",
        "priority",
        "service_class",
        "slots",
        "limits",
        "rates",
        "trace",
        "durability",
    }
)
TASK_DEFAULTS: dict[str, Any] = {
    "attempts": 3,
    "backoff": Backoff(base=1.0, cap=60.0, jitter="full"),
    "timeout": 300.0,
    "retention": Retention(),
    "executor": "async",
    "retry_on": (Exception,),
    "service_class": "standard",
    "slots": 1,
    "limits": None,
    "rates": None,
    "unknown_kwargs": "refuse",
}


class TaskOptions(msgspec.Struct, frozen=True):
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
    limits: tuple[tuple[str, LimitValue], ...] = ()
    """Throttle keys and limits every job of the task names, sorted by key."""
    rates: tuple[tuple[str, Rate], ...] = ()
    """Rate keys and rates every job of the task names, sorted by key."""
    tenant_slots: int | None = None
    """At most this many of one tenant's jobs of the task's lane run at once (a throttle
    key per lane and tenant, ``lane:<lane>:tenant:<tenant>``); None: no cap."""
    unknown_kwargs: UnknownKwargs = "refuse"
    """What a worker does with a stored argument the function does not take."""
    gateway: bool = False
    """Whether tenants may call the task over the HTTP gateway (``POST /v1/jobs``); a
    task not exposed answers there exactly as one that does not exist."""
    deadline_order: bool = False
    """Whether its jobs given a ``deadline=`` run earliest deadline first among their
    tenant's own jobs of one priority (``fairlane.policy.deadlineorder``); False: by
    priority, then in arrival order (unless their class orders by deadline)."""
    defaults: frozenset[str] = msgspec.field(default_factory=frozenset)

    def __post_init__(self) -> None:
        try:
            check_lane(self.lane)
            check_service_class(self.service_class)
            check_slots(self.slots)
            check_limits(dict(self.limits))
            check_rates(dict(self.rates))
            check_key_count(self.limits, self.rates)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"task {self.name}: {exc}") from None
        for flag in ("gateway", "deadline_order"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(
                    f"task {self.name}: {flag} must be True or False, not {getattr(self, flag)!r}"
                )
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
        if self.unknown_kwargs not in ("refuse", "drop"):
            raise ValueError(
                f"task {self.name}: unknown_kwargs must be 'refuse' or 'drop', "
                f"got {self.unknown_kwargs!r}"
            )


@dataclass(frozen=True, slots=True)
class WorkflowOptions:
    """How a workflow's runs are sliced and fanned out."""

    slice_seconds: float = 2.0
    """A slice yields its slot at the first step after this many seconds."""
    slice_steps: int = 20
    """A slice yields its slot after this many new steps."""
    max_children: int = 10
    """At most this many of one run's child jobs run at once (throttle key ``run:<id>``)."""

    def __post_init__(self) -> None:
        if not self.slice_seconds > 0:
            raise ValueError(f"slice_seconds must be > 0, got {self.slice_seconds}")
        if self.slice_steps < 1:
            raise ValueError(f"slice_steps must be >= 1, got {self.slice_steps}")
        if self.max_children < 1:
            raise ValueError(f"max_children must be >= 1, got {self.max_children}")
