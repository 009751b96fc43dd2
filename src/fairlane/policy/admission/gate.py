"""The pool and its gate: whether a lane takes a job now, defers it, or refuses it.

The sections Units, Decision (rules 1-5), Bounds and Release and drain of the admission
contract (``docs/contracts/admission.md``): a pool's
capacity and classes' bounds in units (:class:`PoolConfig`, :class:`AdmissionClass`),
the class table in milli-units (:func:`unit_table`), what the store keeps per lane
(:class:`PoolState`), the decision on one submission (:func:`fits`, :func:`decide`) and
the FIFO drain of deferred queues (:func:`drain`, the baseline; the store readmits by
fair deferral, ``deferral``). The store's twins are ``room_for`` and ``admit_new`` in
``lua/admission.lua``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Literal

import msgspec

from fairlane.policy.admission.units import check_count, check_number, milli_floor, to_milli
from fairlane.policy.classes import ClassTable, ServiceClass, may_start

__all__ = [
    "AdmissionClass",
    "Decision",
    "DeferredJob",
    "FullReason",
    "PoolConfig",
    "PoolState",
    "Reason",
    "WhenFull",
    "decide",
    "drain",
    "fits",
    "unit_table",
]

WhenFull = Literal["reject", "defer"]
FullReason = Literal["tenant_queue_full", "class_queue_full", "class_full"]
Reason = Literal[
    "too_wide", "deadline_unmeetable", "tenant_queue_full", "class_queue_full", "class_full"
]
_WHEN_FULL: tuple[str, ...] = ("reject", "defer")


class AdmissionClass(msgspec.Struct, frozen=True):
    """A class's queue bounds and floor in a pool (the shares are the lane table's)."""

    name: str
    min_units: float = 0.0
    max_queue: int = 1000
    """Most jobs of the class admitted and not finished."""
    max_queue_units: float | None = None
    """Most units of the class admitted and not finished; None: no bound."""
    tenant_max_queue: int | None = None
    """Most jobs of one tenant admitted and not finished in the class; None: ``max_queue``."""
    max_deferred: int | None = None
    """Most deferred jobs of the class; None: ``max_queue``."""
    when_full: WhenFull = "reject"
    tenant_max_queue_units: float | None = None
    """Most units of one tenant admitted and not finished in the class; None: no bound."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"class name must be a non-empty string, got {self.name!r}")
        check_number("min_units", self.min_units)
        check_count("max_queue", self.max_queue)
        for units in ("max_queue_units", "tenant_max_queue_units"):
            if getattr(self, units) is not None:
                check_number(units, getattr(self, units))
        for label in ("tenant_max_queue", "max_deferred"):
            if getattr(self, label) is not None:
                check_count(label, getattr(self, label))
        if self.when_full not in _WHEN_FULL:
            raise ValueError(f"when_full must be one of {_WHEN_FULL}, got {self.when_full!r}")

    @property
    def tenant_limit(self) -> int:
        return self.max_queue if self.tenant_max_queue is None else self.tenant_max_queue

    @property
    def deferred_limit(self) -> int:
        return self.max_queue if self.max_deferred is None else self.max_deferred

    @property
    def min_milli(self) -> int:
        return milli_floor(self.min_units)

    @property
    def max_queue_milli(self) -> int | None:
        return None if self.max_queue_units is None else to_milli(self.max_queue_units)

    @property
    def tenant_queue_milli(self) -> int | None:
        units = self.tenant_max_queue_units
        return None if units is None else to_milli(units)


class PoolConfig(msgspec.Struct, frozen=True):
    """A lane's admission settings: its capacity in units and its classes' bounds."""

    capacity_units: float
    classes: tuple[AdmissionClass, ...] = ()
    recovery_reserve_units: float = 0.0
    """Left free by fresh submissions, so retries of admitted work can come back."""

    def __post_init__(self) -> None:
        if check_number("capacity_units", self.capacity_units) <= 0:
            raise ValueError(f"capacity_units must be > 0, got {self.capacity_units!r}")
        check_number(
            "recovery_reserve_units", self.recovery_reserve_units, high=self.capacity_units
        )
        items = tuple(self.classes)
        for item in items:
            if not isinstance(item, AdmissionClass):
                raise TypeError(f"classes must be AdmissionClass objects, got {item!r}")
        names = [c.name for c in items]
        if len(set(names)) != len(names):
            raise ValueError(f"class names must be unique: {names}")
        msgspec.structs.force_setattr(self, "classes", items)

    @property
    def capacity_milli(self) -> int:
        return to_milli(self.capacity_units)

    @property
    def reserve_milli(self) -> int:
        return to_milli(self.recovery_reserve_units)

    def admission(self, name: str) -> AdmissionClass:
        """The class's settings; a class the pool does not list gets the defaults."""
        for c in self.classes:
            if c.name == name:
                return c
        return AdmissionClass(name)


def unit_table(table: ClassTable, pool: PoolConfig) -> ClassTable:
    """The lane's class table in milli-units: ``min_slots = ceil(min_units * 1000)``."""
    unknown = [c.name for c in pool.classes if c.name not in table]
    if unknown:
        raise ValueError(f"pool classes {unknown} are not classes of the lane ({table.names})")
    classes = []
    for c in table:
        floor = pool.admission(c.name).min_milli
        if c.batch and floor:
            raise ValueError(
                f"batch class {c.name!r} cannot have min_units (it is assured nothing)"
            )
        classes.append(
            ServiceClass(c.name, c.nominal_share, floor, c.lendable, c.borrowable, c.batch)
        )
    return ClassTable(classes)


class PoolState(msgspec.Struct):
    """What the store keeps per lane: reservations, admitted and deferred counts."""

    reserved: dict[str, int] = msgspec.field(default_factory=dict)
    """Reserved milli-units of admitted unfinished jobs, per class."""
    admitted: dict[str, int] = msgspec.field(default_factory=dict)
    """Admitted unfinished jobs, per class."""
    tenant_admitted: dict[tuple[str, str], int] = msgspec.field(default_factory=dict)
    """Admitted unfinished jobs, per (class, tenant)."""
    tenant_reserved: dict[tuple[str, str], int] = msgspec.field(default_factory=dict)
    """Reserved milli-units of admitted unfinished jobs, per (class, tenant)."""
    deferred: dict[str, int] = msgspec.field(default_factory=dict)
    """Deferred jobs, per class."""

    @property
    def total_reserved(self) -> int:
        return sum(self.reserved.values())

    def accept(self, service_class: str, tenant: str, milli_units: int) -> None:
        self.reserved[service_class] = self.reserved.get(service_class, 0) + milli_units
        self.admitted[service_class] = self.admitted.get(service_class, 0) + 1
        key = (service_class, tenant)
        self.tenant_admitted[key] = self.tenant_admitted.get(key, 0) + 1
        self.tenant_reserved[key] = self.tenant_reserved.get(key, 0) + milli_units

    def release(self, service_class: str, tenant: str, milli_units: int) -> None:
        """A job finished or left for its backoff: give back what ``accept`` took."""
        key = (service_class, tenant)
        if (
            self.reserved.get(service_class, 0) < milli_units
            or self.admitted.get(service_class, 0) < 1
            or self.tenant_admitted.get(key, 0) < 1
        ):
            raise ValueError(f"release of {service_class}/{tenant} ({milli_units}) never admitted")
        self.reserved[service_class] -= milli_units
        self.admitted[service_class] -= 1
        self.tenant_admitted[key] -= 1
        self.tenant_reserved[key] = self.tenant_reserved.get(key, 0) - milli_units

    def defer(self, service_class: str) -> None:
        self.deferred[service_class] = self.deferred.get(service_class, 0) + 1

    def undefer(self, service_class: str) -> None:
        if self.deferred.get(service_class, 0) < 1:
            raise ValueError(f"class {service_class!r} has no deferred job")
        self.deferred[service_class] -= 1


class Decision(msgspec.Struct, frozen=True):
    status: Literal["accepted", "deferred", "rejected"]
    reason: Reason | None = None


def fits(
    table: ClassTable,
    pool: PoolConfig,
    state: PoolState,
    *,
    service_class: str,
    tenant: str,
    milli_units: int,
    fresh: bool,
    held: bool = False,
) -> FullReason | None:
    """Rules 3-5: None if the request may be admitted now, else why not. ``held``: the
    class's pinned deferred head has used up its overtakes (``deferral``), so only the
    deferred queue's own pass may take its room (``class_full`` for anything else)."""
    mu = check_count("milli_units", milli_units)
    spec = pool.admission(service_class)
    key = (service_class, tenant)
    tenant_milli = spec.tenant_queue_milli
    if state.tenant_admitted.get(key, 0) >= spec.tenant_limit or (
        tenant_milli is not None and state.tenant_reserved.get(key, 0) + mu > tenant_milli
    ):
        return "tenant_queue_full"
    queue_milli = spec.max_queue_milli
    if state.admitted.get(service_class, 0) >= spec.max_queue or (
        queue_milli is not None and state.reserved.get(service_class, 0) + mu > queue_milli
    ):
        return "class_queue_full"
    if held:
        return "class_full"
    capacity = pool.capacity_milli
    units = unit_table(table, pool)
    # The class rules need a width >= 1; a free job is judged as the narrowest one.
    width = max(mu, 1)
    room = may_start(
        units,
        capacity,
        state.reserved,
        {service_class: width},
        service_class,
        demand={service_class: width},
    )
    if room and (not fresh or capacity - state.total_reserved - mu >= pool.reserve_milli):
        return None
    return "class_full"


def decide(
    table: ClassTable,
    pool: PoolConfig,
    state: PoolState,
    *,
    service_class: str,
    tenant: str,
    milli_units: int,
    fresh: bool,
    deadline_ms: int | None,
    now_ms: int,
    max_reservation_milli: int,
    held: bool = False,
    needs_ms: int = 0,
) -> Decision:
    """The gate's answer to one submission (rules 1-5 of the admission contract); pure.
    ``held`` as for :func:`fits`. ``needs_ms``: how long from now the job is expected to
    take to finish, wait included (``fairlane.policy.startpredict``; 0 not estimated):
    a deadline it would miss is unmeetable as one already past."""
    if service_class not in table:
        raise ValueError(f"unknown service class: {service_class!r}")
    if check_count("milli_units", milli_units) > max_reservation_milli:
        return Decision("rejected", "too_wide")
    if deadline_ms is not None and (
        deadline_ms <= now_ms or (needs_ms > 0 and now_ms + needs_ms > deadline_ms)
    ):
        return Decision("rejected", "deadline_unmeetable")
    reason = fits(
        table,
        pool,
        state,
        service_class=service_class,
        tenant=tenant,
        milli_units=milli_units,
        fresh=fresh,
        held=held,
    )
    if reason is None:
        return Decision("accepted")
    spec = pool.admission(service_class)
    if not fresh or (
        spec.when_full == "defer" and state.deferred.get(service_class, 0) < spec.deferred_limit
    ):
        return Decision("deferred", reason)
    return Decision("rejected", reason)


class DeferredJob(msgspec.Struct, frozen=True):
    """One entry of a class's deferred queue."""

    tenant: str
    milli_units: int
    fresh: bool = True


def drain(
    table: ClassTable,
    pool: PoolConfig,
    state: PoolState,
    queues: Mapping[str, deque[DeferredJob]],
) -> list[tuple[str, DeferredJob]]:
    """After a release: admit deferred heads, classes in table order, each FIFO until
    its head does not fit (rules 3-5). Mutates ``state`` and ``queues``; returns the
    admitted jobs with their class, in admission order. The FIFO reference the store
    followed before fair deferral (``deferral.DeferredQueue``), kept as the baseline
    the simulator and the policy's tests compare it with."""
    admitted: list[tuple[str, DeferredJob]] = []
    for name in table.names:
        queue = queues.get(name)
        while queue:
            head = queue[0]
            reason = fits(
                table,
                pool,
                state,
                service_class=name,
                tenant=head.tenant,
                milli_units=head.milli_units,
                fresh=head.fresh,
            )
            if reason is not None:
                break
            queue.popleft()
            state.undefer(name)
            state.accept(name, head.tenant, head.milli_units)
            admitted.append((name, head))
    return admitted
