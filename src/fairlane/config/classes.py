"""A lane's classes and its admission pool: the one TOML shape, and its one reader.

This module owns how a lane's service classes are written, wherever the lane is
declared: in a lanes file (``[lanes.<lane>]``: the ``lanes_file`` setting,
``load_lanes``) or in a config file (``[pools.<lane>]``: ``App(config=...)``,
``load_config``). A pool *is* a lane, so both read one shape with one reader
(``read_lane``): a table per class, keyed by its name, in declared order (the rank
tie-break); a pool adds its capacity and the classes' admission bounds::

    [lanes.heavy.classes.interactive]   # a lanes file: the lane's slot table alone
    nominal_share = 0.7                 # share of C assured to the class (default 0)
    min_slots = 2                       # a floor on its assured slots (default 0)
    lendable = 0.5                      # of its assured slots, the part it lends (default 1)
    borrowable = 1.0                    # how far above its assured level, x nominal (omit: C)

    [lanes.heavy.classes.bulk]
    batch = true                        # runs on spare only; assured nothing
    max_wait = "12h"                    # aged past it: served as the class above (omit: never)
    restricted = true                   # only entitled tenants may use it (default false)
    deadline_order = true               # a tenant's jobs with a deadline: earliest first

    [pools.agent-shared]                # a config file: the same lane with its pool
    capacity_units = 100                # required
    recovery_reserve_units = 5          # default 0

    [pools.agent-shared.classes.guaranteed]
    nominal_share = 0.5                 # the slot keys above, and the admission bounds:
    min_units = 30                      # min_units, max_queue, max_queue_units,
    max_queue = 200                     # tenant_max_queue, tenant_max_queue_units,
    response_when_full = "reject"       # max_deferred, response_when_full

A class's keys mean the same in both places; admission bounds in a lanes file are an
error naming the config file's table, since a lane without a pool has nothing to bound.
**Batch.** ``batch = true`` makes the class a batch class for slots *and* units: it runs
only on spare, is assured nothing, and so must leave ``nominal_share``, ``min_slots``,
``min_units`` and ``borrowable`` out (or zero). Without ``batch`` a class is an ordinary
one whatever its name. The nominal shares of the non-batch classes sum to at most 1.
**Aging.** ``max_wait`` (a duration, ``"90s"``, ``"12h"``, or seconds) lets a class's
waiting head, once it has waited that long, be served as the class declared just
before it (``fairlane.policy.classes`` states the rule); the first class cannot
declare it. It shapes dispatch only, not admission.
**Restricted.** ``restricted = true`` lets only the tenants entitled to the class use it
(``app.tenants.configure(tenant, classes=[...])``); anyone else's job in it is refused
(``class_not_entitled``). A declared class is unrestricted unless it says so, whatever
its name.
**Deadline order.** ``deadline_order = true`` runs a tenant's jobs of the class that
carry a ``deadline=`` earliest deadline first, before its jobs of the same priority with
a later deadline or none (``fairlane.policy.deadlineorder``); between tenants nothing
changes. Off by default: a tenant's jobs run by priority, then in arrival order.

The array shape of lanes files, ``[[lanes.<lane>.classes]]`` with a ``name`` key, is
deprecated and read by ``fairlane.config.legacy``. The rules the tables feed are in
``fairlane.policy.classes`` and ``fairlane.policy.admission``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from fairlane.config.files import TableReader, join_key
from fairlane.policy.admission import AdmissionClass, PoolConfig
from fairlane.policy.classes import ClassTable, ServiceClass
from fairlane.policy.retention import parse_duration

__all__ = ["ADMISSION_KEYS", "CLASS_KEYS", "POOL_KEYS", "SLOT_KEYS", "read_classes", "read_pool"]

SLOT_KEYS = (
    "nominal_share",
    "min_slots",
    "lendable",
    "borrowable",
    "batch",
    "max_wait",
    "restricted",
    "deadline_order",
)
"""A class's keys that shape the lane's slot table (``ServiceClass``)."""
ADMISSION_KEYS = (
    "min_units",
    "max_queue",
    "max_queue_units",
    "tenant_max_queue",
    "tenant_max_queue_units",
    "max_deferred",
    "response_when_full",
)
"""A class's keys that bound it at the lane's admission gate (``AdmissionClass``)."""
CLASS_KEYS = ("nominal_share", *ADMISSION_KEYS, *SLOT_KEYS[1:])
POOL_KEYS = ("capacity_units", "recovery_reserve_units", "classes")
_WHEN_FULL = ("reject", "defer")
# a batch class is assured nothing, in slots or in units, and borrows without bound
_NOT_FOR_BATCH = ("nominal_share", "min_slots", "min_units", "borrowable")


def read_classes(body: object, path: str, source: str) -> ClassTable:
    """A lane's slot table from its TOML table, which holds its classes alone.

    ``path`` is the table's (``lanes.heavy``); errors read ``<source>: <key path>: <problem>``.
    """
    reader = TableReader(body, path, source, ("classes",))
    return _read_classes(reader, pool=False)[0]


def read_pool(body: object, path: str, source: str) -> tuple[ClassTable, PoolConfig]:
    """A lane's slot table and its admission pool, from the pool's TOML table.

    ``path`` is the table's (``pools.agent-shared``); errors read
    ``<source>: <key path>: <problem>``.
    """
    reader = TableReader(body, path, source, POOL_KEYS)
    if "capacity_units" not in reader.data:
        raise reader.error(reader.at("capacity_units"), "is required")
    capacity = reader.number("capacity_units", 0.0, positive=True)
    reserve = reader.number("recovery_reserve_units", 0.0)
    if reserve > capacity:
        raise reader.error(
            reader.at("recovery_reserve_units"),
            f"must be at most capacity_units ({capacity:g}), got {reserve:g}",
        )
    table, bounds = _read_classes(reader, pool=True)
    return table, PoolConfig(capacity, bounds, reserve)


def _read_classes(
    lane: TableReader, *, pool: bool
) -> tuple[ClassTable, tuple[AdmissionClass, ...]]:
    """The lane's classes: its slot table and, for a pool, each class's admission bounds."""
    classes = lane.at("classes")
    bodies = lane.data.get("classes")
    if not isinstance(bodies, Mapping) or not bodies:
        raise lane.error(classes, f"needs at least one class ([{classes}.<name>])")
    slots: list[ServiceClass] = []
    bounds: list[AdmissionClass] = []
    for name, body in bodies.items():
        entry = TableReader(body, join_key(classes, str(name)), lane.source, CLASS_KEYS)
        slots.append(_service_class(str(name), entry, pool=pool))
        if pool:
            bounds.append(_admission_class(str(name), entry))
    return lane.build(ClassTable, classes, classes=slots), tuple(bounds)


def _service_class(name: str, entry: TableReader, *, pool: bool) -> ServiceClass:
    if not pool:
        for key in ADMISSION_KEYS:
            if key in entry.data:
                raise entry.error(
                    entry.at(key),
                    "bounds the lane's admission pool, and this lane has none: declare it "
                    "with its capacity_units under [pools.<lane>] in a config file "
                    "(App(config=...))",
                )
    batch = entry.flag("batch")
    if batch:
        for key in _NOT_FOR_BATCH:
            if entry.data.get(key, 0):
                raise entry.error(
                    entry.at(key),
                    "a batch class is assured nothing and borrows without bound; leave "
                    f"{key} out (or drop batch = true for an ordinary class with a share)",
                )
    share = entry.number("nominal_share", 0.0)
    lendable = entry.number("lendable", 1.0)
    for key, value in (("nominal_share", share), ("lendable", lendable)):
        if value > 1:
            raise entry.error(entry.at(key), f"must be within [0, 1], got {value!r}")
    borrowable = entry.optional_number("borrowable")
    max_wait = _max_wait(entry)
    return entry.build(
        ServiceClass,
        entry.path,
        name=name,
        nominal_share=share,
        min_slots=entry.count("min_slots", 0),
        lendable=lendable,
        borrowable=borrowable,
        batch=batch,
        max_wait=max_wait,
        restricted=entry.flag("restricted"),
        deadline_order=entry.flag("deadline_order"),
    )


def _max_wait(entry: TableReader) -> float | None:
    """The class's ``max_wait`` in seconds, from a duration string or a number."""
    value = entry.data.get("max_wait")
    if value is None:
        return None
    try:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ValueError(f"got {value!r}")
        seconds = parse_duration(value)
    except ValueError as exc:
        raise entry.error(
            entry.at("max_wait"), f'must be a duration ("90s", "12h") or seconds: {exc}'
        ) from None
    if not 0 < seconds < math.inf:
        raise entry.error(entry.at("max_wait"), f"must be > 0 and finite, got {value!r}")
    return seconds


def _admission_class(name: str, entry: TableReader) -> AdmissionClass:
    return entry.build(
        AdmissionClass,
        entry.path,
        name=name,
        min_units=entry.number("min_units", 0.0),
        max_queue=entry.count("max_queue", 1000),
        max_queue_units=entry.optional_number("max_queue_units"),
        tenant_max_queue=entry.optional_count("tenant_max_queue"),
        tenant_max_queue_units=entry.optional_number("tenant_max_queue_units"),
        max_deferred=entry.optional_count("max_deferred"),
        when_full=entry.choice("response_when_full", "reject", _WHEN_FULL),
    )
