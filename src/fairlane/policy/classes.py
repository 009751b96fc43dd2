"""Service classes: shares of one lane's capacity, with floors, lending and borrowing.

A lane has a capacity of ``C`` slots (the live sum of its workers' slots). Its
service classes share those slots the way Kubernetes API Priority and Fairness
shares a server's seats between priority levels. Nothing here preempts: a decision
only says which class's head job may start *now*, given

* ``C``, each class's in-flight slots ``f``,
* the width ``w`` (in slots) of each class's head job (``None``: nothing waiting),
* optionally each class's whole waiting demand ``d`` in slots (default ``w``).

Derivation (all integers, computed afresh from ``C`` on every call):

* **Nominal** ``n = floor(nominal_share * C)`` (floor with a 1e-9 tolerance, so that
  ``0.29 * 100`` is 29). Shares of the non-batch classes sum to at most 1, so the
  nominals never oversubscribe ``C``; the leftover ``C - sum(n)`` is nobody's.
* **Assured** ``a = max(min_slots, n)``: APF's assured concurrency. Floors *can*
  oversubscribe a small ``C``; nothing is scaled down then. Every class keeps its
  ``a``, they cannot all hold it at once, and free slots go to the waiting classes
  below their assured level in rank order (below), so under full contention the
  holdings split roughly in proportion to the assured levels.
* **Lending.** A class may lend ``L = floor(lendable * a)`` of its assured slots; the
  rest ``a - L`` is a reserve kept free for its own next arrivals. Its **claim** on
  the free slots is ``max(0, min(a, max(f + d, a - L)) - f)``: the slots of its
  assured level it keeps for waiting work or in reserve. Waiting work counts here
  (``d > 0``) only while the head fits the assured level (``f + w <= a``, and not too
  wide); a head that must borrow is protected by holding (rule 5) instead -- were it
  to claim too, two wide heads could each claim what the other needs, for ever.
  Free slots no class claims (idle lendable slots, the unassigned leftover) are
  **spare**.
* **Borrowing.** A class may hold up to its **ceiling**: ``C`` if ``borrowable`` is
  ``None``, else ``min(C, a + floor(borrowable * n))`` -- ``borrowable`` is how far
  above its assured level it may go, as a fraction of its nominal (APF's
  borrowing limit). **Max width** is the widest job it could ever start with
  everyone else idle: ``max(min(a, C), min(ceiling, C - sum of the others' a - L))``.
* **Batch** classes have nominal 0, floor 0 and ceiling ``C``: they are assured
  nothing, lend nothing, claim nothing, and start only when no non-batch class may
  start. Their waiting work is never counted in ``Allocation.pressure``, so it
  triggers nothing (no scale-up).

Rules, for a class with head width ``w`` (``F`` = free slots ``max(0, C - sum f)``):

1. ``w`` above its max width: ``too-wide``; it waits (for ``C`` to grow), claims only
   its reserve, and holds nobody back.
2. ``f + w <= a`` (**within assured**): it may start iff ``w <= F``.
3. Otherwise it **borrows**: iff ``f + w <= ceiling``, ``w <= F`` and ``w <= F - the
   other classes' claims`` (it takes only spare), no better-ranked class is held
   (rule 5), and -- for a batch class -- no non-batch class may start.
4. **Rank**: non-batch before batch, then the lowest ``f / a`` (classes with ``a = 0``
   after the others, by fewest in flight), ties by declared order (the table's order:
   ``guaranteed``, ``standard``, ``batch``). ``next_class`` serves the best-ranked
   class that may start.
5. **Wide jobs.** A class's head job is never overtaken inside its class (only heads
   are offered). Across classes, a class that is within its bounds (not too wide,
   not at its ceiling) but blocked for lack of free or spare slots *holds* them:
   no worse-ranked class may borrow until it has started. Within-assured starts are
   never held back (they are owed), and they only use their own claims.

Postconditions (``tests/policy/test_classes.py`` checks them on a virtual clock):

P1. Starting the chosen job never makes the in-flight total exceed ``C``.
P2. A class within its assured level whose head fits the free slots may start, and
    ``next_class`` returns it or a better-ranked class (lower ``f / a``).
P3. A borrowing start leaves at least the other classes' claims free: a class's
    waiting demand up to its assured level and its reserve are never lent, so a
    returning lender gets the next freed slots until it is back at ``a``; borrowed
    work is never cut short.
P4. A class never holds more than its ceiling by starting work, and never starts
    beyond its assured level except from spare.
P5. A batch class starts only when no non-batch class may start and only on spare,
    so a returning class reclaims batch's slots within one batch job's duration.
P6. A busy class cannot keep another below its assured level: its borrowing stops
    at the other's claim, whatever the rank (for heads that fit the other's
    assured level; a wider head relies on P7).
P7. A head job no wider than its class's max width eventually starts once the
    others' demand allows: nothing in its class overtakes it, and no worse-ranked
    class borrows the slots it is waiting for.

**Aging** (``max_wait``). A class may declare ``max_wait``: its head job, once it has
waited longer than that (``waited_ms`` given to ``next_class``; the server's clock), is
*aged* and is served as the class declared just before it, ``u`` (the next class up;
the first class of a table cannot declare it). ``next_class`` first moves aged heads
up, in declared order, then decides by the rules above on the moved state:

A1. Class ``i``'s aged head moves into ``u = i - 1``'s place iff ``u``'s own head did
    not move up itself (one step, no chains: a class whose head moved hosts nobody),
    ``u`` has no head or a strictly younger one (a tie stays with ``u``), the head is
    no wider than ``u``'s max width, and ``f_u + f_i + w_i <= u``'s ceiling.
A2. The moved head is judged as ``u``'s head, with ``i``'s in-flight slots counted as
    ``u``'s (``f_u + f_i``) and ``u``'s waiting demand ``d_u + w_i``; ``i`` is then
    judged with nothing waiting and nothing in flight. Slots in flight keep their sum,
    so P1 holds as before. ``u``'s own head waits that decision: it is younger.
A3. When ``u``'s place is chosen, ``next_class`` names ``i``: its head starts, and the
    job keeps its class (its slots are ``i``'s in flight, released as ``i``'s).

So aged work shares ``u``'s assured level and ceiling *with* ``u``'s own work (it is
counted against them), oldest head first, and never takes what ``u``'s rules would
not give ``u`` itself. Starvation-free (P8): while ``u``'s head is older, each start
in ``u``'s place serves one of ``u``'s jobs that waited longer than the aged head --
finitely many -- so, when ``u`` declares no ``max_wait`` of its own, the aged head
starts at the first start ``u`` is given after them (P7 holds for it as ``u``'s head).
A class whose head does not move competes under its own rules as before; without
``max_wait`` anywhere (or without ``waited_ms``) nothing moves and ``next_class`` is
exactly the rules above. The reference model (``fairlane.policy.reference``) and the
scripts' state machine cover tables without ``max_wait``; aging is held equal to the
Lua (``lua/classes.lua``) by ``tests/store/test_classes_lua.py``.

``lent`` in the snapshot is an attribution for metrics only, never used to decide:
borrowed work counts against the unassigned leftover first, then against the
lenders' idle lendable slots, then against their other idle assured slots (only
after ``C`` shrank), each in reverse declared order. Everything is O(classes), but
for sorting them by rank.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from fractions import Fraction
from typing import Literal

import msgspec

from fairlane.policy.retention import parse_duration

__all__ = [
    "DEFAULT_CLASSES",
    "Allocation",
    "ClassTable",
    "ClassView",
    "Entitlement",
    "Reason",
    "ServiceClass",
    "allocate",
    "allocate_observed",
    "assured_slots",
    "check_class_name",
    "levels",
    "may_start",
    "move_aged",
    "next_class",
]

Reason = Literal[
    "idle", "assured", "borrow", "no-slots", "no-spare", "ceiling", "held", "yield", "too-wide"
]
"""Why a class may or may not start its head job; ``assured`` and ``borrow`` may."""

_STARTS: frozenset[str] = frozenset({"assured", "borrow"})
_BLOCKED: frozenset[str] = frozenset({"no-slots", "no-spare", "held"})
_EPS = 1e-9
_BAD_NAME_CHARS = "{}:| \t\n"


def _floor(x: float) -> int:
    return math.floor(x + _EPS)


def _fraction(label: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{label} must be within [0, 1], got {value!r}")


def check_class_name(name: object) -> str:
    """``name`` if it can name a class: a non-empty string without braces, colons, ``|``
    or spaces (it is part of key names)."""
    if not isinstance(name, str):
        raise TypeError(f"a class name must be a string, got {name!r}")
    if not name or any(c in name for c in _BAD_NAME_CHARS):
        raise ValueError(f"class name must be non-empty, no braces/colons/|/spaces: {name!r}")
    return name


@dataclass(frozen=True, slots=True)
class ServiceClass:
    """One class of a lane: its nominal share of ``C``, a floor, and lending bounds."""

    name: str
    nominal_share: float = 0.0
    """Fraction of the lane's capacity it is assured (before the floor)."""
    min_slots: int = 0
    """A floor on its assured slots, whatever ``C`` is."""
    lendable: float = 1.0
    """Fraction of its assured slots it lends while idle; the rest stays free for it."""
    borrowable: float | None = None
    """How far above its assured level it may go, as a fraction of its nominal; None: to C."""
    batch: bool = False
    """Runs only on spare no other class may use now; its waiting never counts as pressure."""
    max_wait: float | str | timedelta | None = None
    """Seconds (or ``"12h"``, a ``timedelta``) after which its waiting head is served as
    the class declared before it (aging); None: never. Read back as seconds."""
    restricted: bool = False
    """Only tenants entitled to it may put jobs in it (``Entitlement``); the store refuses
    anyone else's with ``class_not_entitled``, at enqueue and at each retry."""
    deadline_order: bool = False
    """Its jobs with a deadline run earliest deadline first among their tenant's own jobs
    of one priority (``fairlane.policy.deadlineorder``); never across tenants."""

    def __post_init__(self) -> None:
        check_class_name(self.name)
        _fraction("nominal_share", self.nominal_share)
        _fraction("lendable", self.lendable)
        if isinstance(self.min_slots, bool) or not isinstance(self.min_slots, int):
            raise TypeError(f"min_slots must be an int, got {self.min_slots!r}")
        if self.min_slots < 0:
            raise ValueError(f"min_slots must be >= 0, got {self.min_slots}")
        if self.borrowable is not None and not 0.0 <= self.borrowable < math.inf:
            raise ValueError(f"borrowable must be >= 0 and finite, or None: {self.borrowable!r}")
        if self.batch and (self.nominal_share or self.min_slots or self.borrowable is not None):
            raise ValueError(
                f"batch class {self.name!r} must have nominal_share 0, min_slots 0, borrowable None"
            )
        for flag in ("restricted", "deadline_order"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        if self.max_wait is not None:
            if isinstance(self.max_wait, bool):
                raise TypeError(f"max_wait must be a duration, got {self.max_wait!r}")
            seconds = parse_duration(self.max_wait)
            if not 0.0 < seconds < math.inf:
                raise ValueError(f"max_wait must be > 0 and finite, got {self.max_wait!r}")
            object.__setattr__(self, "max_wait", seconds)

    @property
    def max_wait_ms(self) -> int | None:
        """``max_wait`` in whole milliseconds (at least 1), as the scripts compare it."""
        if self.max_wait is None:
            return None
        return max(1, round(float(parse_duration(self.max_wait)) * 1000))

    def nominal(self, capacity: int) -> int:
        return _floor(self.nominal_share * capacity)

    def assured(self, capacity: int) -> int:
        return max(self.min_slots, self.nominal(capacity))

    def lend_limit(self, capacity: int) -> int:
        return _floor(self.lendable * self.assured(capacity))

    def ceiling(self, capacity: int) -> int:
        if self.borrowable is None:
            return capacity
        bound = self.assured(capacity) + _floor(self.borrowable * self.nominal(capacity))
        return min(capacity, bound)


DEFAULT_CLASSES: tuple[ServiceClass, ...] = (
    ServiceClass("guaranteed", nominal_share=0.6, min_slots=1, restricted=True),
    ServiceClass("standard", nominal_share=0.4, min_slots=1),
    ServiceClass("batch", batch=True),
)
"""Guaranteed is assured 60 % of the lane, standard 40 %; each lends all of its idle
share and may borrow up to ``C``, so a fleet running one class uses every slot; batch
runs on spare only. A class that must start at once even after a batch flood keeps a
reserve (``lendable < 1``); nothing is preempted, so without one it waits at most for
one borrowed job to finish. Guaranteed is restricted: only the tenants entitled to it
(``app.tenants.configure(tenant, classes=["guaranteed"])``) may use it."""


class Entitlement(msgspec.Struct, frozen=True):
    """Which restricted classes a tenant may use, and the class its jobs take when
    neither the call nor the task names one. Kept in the store per tenant; the enqueue
    script is its twin (``lua/classes.lua``, ``classes.tenant_class``, called by the enqueue)."""

    classes: frozenset[str] = frozenset()
    """The restricted classes it may use (an unrestricted class needs no entitlement)."""
    default_class: str | None = None
    """The class of its jobs that name none, where the lane has it and the tenant may
    use it (else the lane's default class, as for any tenant); None: no default."""

    def may_use(self, service_class: ServiceClass) -> bool:
        """Whether a job of this tenant may be in ``service_class``."""
        return not service_class.restricted or service_class.name in self.classes

    def class_for(self, table: ClassTable, named: str, *, by_name: bool) -> str:
        """The class a job takes: ``named`` (the call's or the task's), unless nobody named
        it (``by_name`` False) and the default class is one this tenant may use here."""
        default = self.default_class
        if by_name or default is None or default not in table:
            return named
        return default if self.may_use(table[default]) else named


@dataclass(frozen=True, slots=True, init=False)
class ClassTable:
    """The classes of one lane, in declared order (the rank tie-break)."""

    classes: tuple[ServiceClass, ...]
    #: the classes' names, for ``in`` (asked by every enqueue)
    _names: frozenset[str] = field(repr=False, compare=False)

    def __init__(self, classes: Iterable[ServiceClass] = DEFAULT_CLASSES) -> None:
        items = tuple(classes)
        if not items:
            raise ValueError("a class table needs at least one class")
        names = [c.name for c in items]
        if len(set(names)) != len(names):
            raise ValueError(f"class names must be unique: {names}")
        total = sum(c.nominal_share for c in items if not c.batch)
        if total > 1.0 + _EPS:
            raise ValueError(f"nominal shares of non-batch classes sum to {total:.6g} > 1")
        if items[0].max_wait is not None:
            raise ValueError(
                f"class {items[0].name!r} is declared first: no class is above it to serve "
                "its aged jobs as; leave max_wait out"
            )
        object.__setattr__(self, "classes", items)
        object.__setattr__(self, "_names", frozenset(names))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.classes)

    def __iter__(self) -> Iterator[ServiceClass]:
        return iter(self.classes)

    def __len__(self) -> int:
        return len(self.classes)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __getitem__(self, name: str) -> ServiceClass:
        for c in self.classes:
            if c.name == name:
                return c
        raise KeyError(name)


class ClassView(msgspec.Struct, frozen=True):
    """One class in an ``Allocation``: its levels, its use, and the verdict on its head."""

    name: str
    assured: int
    ceiling: int
    max_width: int
    in_flight: int
    waiting: int | None
    """Width of its head job, None when nothing waits."""
    claim: int
    """Free slots kept for it (its waiting demand up to ``assured``, and its reserve)."""
    borrowed: int
    """Slots it holds above its assured level."""
    lent: int
    """Slots of its idle assured level held by borrowers (an attribution, see module doc)."""
    reason: Reason

    @property
    def may_start(self) -> bool:
        return self.reason in _STARTS


class Allocation(msgspec.Struct, frozen=True):
    """A snapshot of one decision: who may start, who is next, and why."""

    capacity: int
    free: int
    unassigned: int
    """``C`` minus the assured levels; negative when floors oversubscribe ``C``."""
    chosen: str | None
    classes: tuple[ClassView, ...]
    pressure: int
    """Slots of waiting non-batch work, the signal to scale on; batch waiting never adds."""

    def __getitem__(self, name: str) -> ClassView:
        for view in self.classes:
            if view.name == name:
                return view
        raise KeyError(name)


def assured_slots(table: ClassTable, capacity: int) -> dict[str, int]:
    """Each class's assured slots ``max(min_slots, floor(nominal_share * capacity))``."""
    _check_capacity(capacity)
    return {c.name: c.assured(capacity) for c in table}


def _check_capacity(capacity: int) -> None:
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")


def _read(
    table: ClassTable,
    in_flight: Mapping[str, int],
    waiting_width: Mapping[str, int | None],
    demand: Mapping[str, int] | None,
) -> tuple[list[int], list[int | None], list[int]]:
    for mapping in (in_flight, waiting_width, demand or {}):
        unknown = set(mapping) - set(table.names)
        if unknown:
            raise ValueError(f"unknown service classes: {sorted(unknown)}")
    f = [in_flight.get(name, 0) for name in table.names]
    w = [waiting_width.get(name) for name in table.names]
    d = [(demand or {}).get(name, 0) for name in table.names]
    if min(f) < 0 or min(d) < 0 or any(x is not None and x < 1 for x in w):
        raise ValueError("in-flight and demand must be >= 0 and head widths >= 1")
    return f, w, [0 if w_i is None else max(d_i, w_i) for d_i, w_i in zip(d, w, strict=True)]


def _rank_key(c: ServiceClass, index: int, f: int, a: int) -> tuple[bool, bool, Fraction, int]:
    return (c.batch, a == 0, Fraction(f, a) if a else Fraction(f), index)


def _judge(
    w: int | None, f: int, a: int, *, ceiling: int, widest: int, free: int, spare: int
) -> Reason:
    """Rules 1-3 for one class, before holds and batch yielding."""
    if w is None:
        return "idle"
    if w > widest:
        return "too-wide"
    if f + w <= a:
        return "assured" if w <= free else "no-slots"
    if f + w > ceiling:
        return "ceiling"
    if w > free:
        return "no-slots"
    return "borrow" if w <= spare else "no-spare"


def _lent(a: list[int], f: list[int], lend: list[int], capacity: int) -> list[int]:
    idle = [max(0, a_i - f_i) for a_i, f_i in zip(a, f, strict=True)]
    excess = sum(max(0, f_i - a_i) for a_i, f_i in zip(a, f, strict=True))
    left = max(0, excess - max(0, capacity - sum(a)))
    lent = [0] * len(a)
    for bound in ([min(x, y) for x, y in zip(idle, lend, strict=True)], idle):
        for i in reversed(range(len(a))):
            take = min(left, bound[i] - lent[i])
            lent[i] += take
            left -= take
    return lent


def allocate_observed(
    table: ClassTable, capacity: int, in_flight: Mapping[str, int], waiting: Mapping[str, int]
) -> Allocation:
    """The decision for a lane state as an operator sees it: slots in flight and waiting
    per class. Classes the table does not know are left out, counts are clamped at 0,
    and a waiting class is taken to have a one-slot head: the state keeps no head
    widths, and most jobs are one slot wide."""
    known = set(table.names)
    flying = {k: max(0, v) for k, v in in_flight.items() if k in known}
    queued = {k: max(0, v) for k, v in waiting.items() if k in known}
    heads: dict[str, int | None] = {name: 1 if queued.get(name) else None for name in known}
    return allocate(table, capacity, flying, heads, demand=queued)


def levels(table: ClassTable, capacity: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """Each class's assured level, lend limit, ceiling and max width at ``capacity``, in
    the table's order: what ``allocate`` judges against, and what a caller deciding
    many times at one capacity computes once."""
    a = [c.assured(capacity) for c in table]
    lend = [c.lend_limit(capacity) for c in table]
    ceil = [c.ceiling(capacity) for c in table]
    reserves = sum(a) - sum(lend)
    widest = [
        max(min(a[i], capacity), min(ceil[i], capacity - reserves + a[i] - lend[i]))
        for i in range(len(a))
    ]
    return a, lend, ceil, widest


def allocate(
    table: ClassTable,
    capacity: int,
    in_flight: Mapping[str, int],
    waiting_width: Mapping[str, int | None],
    *,
    demand: Mapping[str, int] | None = None,
) -> Allocation:
    """The full decision for one lane state (see the module docstring for the rules)."""
    _check_capacity(capacity)
    f, w, d = _read(table, in_flight, waiting_width, demand)
    cls = table.classes
    a, lend, ceil, widest = levels(table, capacity)
    pressure = sum(d_i for d_i, c in zip(d, cls, strict=True) if not c.batch)
    # Waiting work claims slots only while its head fits the assured level (rule 1, claims).
    owed = [
        d_i if w_i is not None and f_i + w_i <= min(a_i, top) else 0
        for d_i, w_i, f_i, a_i, top in zip(d, w, f, a, widest, strict=True)
    ]
    claim = [max(0, min(a[i], max(f[i] + owed[i], a[i] - lend[i])) - f[i]) for i in range(len(cls))]
    free = max(0, capacity - sum(f))
    order = sorted(range(len(cls)), key=lambda i: _rank_key(cls[i], i, f[i], a[i]))
    reasons: list[Reason] = ["idle"] * len(cls)
    held = False
    nonbatch_starts = False
    claimed = sum(claim)
    for i in order:
        spare = free - (claimed - claim[i])
        r = _judge(w[i], f[i], a[i], ceiling=ceil[i], widest=widest[i], free=free, spare=spare)
        if r == "borrow" and held:
            r = "held"
        elif r == "borrow" and cls[i].batch and nonbatch_starts:
            r = "yield"
        held = held or r in _BLOCKED
        nonbatch_starts = nonbatch_starts or (r in _STARTS and not cls[i].batch)
        reasons[i] = r
    lent = _lent(a, f, lend, capacity)
    views = tuple(
        ClassView(
            name=c.name,
            assured=a[i],
            ceiling=ceil[i],
            max_width=widest[i],
            in_flight=f[i],
            waiting=w[i],
            claim=claim[i],
            borrowed=max(0, f[i] - a[i]),
            lent=lent[i],
            reason=reasons[i],
        )
        for i, c in enumerate(cls)
    )
    chosen = next((cls[i].name for i in order if reasons[i] in _STARTS), None)
    return Allocation(
        capacity=capacity,
        free=free,
        unassigned=capacity - sum(a),
        chosen=chosen,
        classes=views,
        pressure=pressure,
    )


def move_aged(
    table: ClassTable,
    capacity: int,
    in_flight: Mapping[str, int],
    waiting_width: Mapping[str, int | None],
    waited_ms: Mapping[str, int],
    *,
    demand: Mapping[str, int] | None = None,
) -> tuple[dict[str, int], dict[str, int | None], dict[str, int], dict[str, str]]:
    """The lane state with aged heads moved up (rules A1-A2): in-flight slots, head
    widths and demands per class, and which class's head each moved-into place holds
    (``{u: i}``). ``waited_ms`` is how long each class's head has waited (absent: 0)."""
    _check_capacity(capacity)
    f, w, d = _read(table, in_flight, waiting_width, demand)
    names, cls = table.names, table.classes
    _, _, ceil, widest = levels(table, capacity)
    age = [waited_ms.get(name, 0) for name in names]
    moved: dict[str, str] = {}
    went_up = [False] * len(cls)
    for i in range(1, len(cls)):
        limit, u, wi = cls[i].max_wait_ms, i - 1, w[i]
        if limit is None or wi is None or age[i] <= limit or went_up[u]:
            continue
        if w[u] is not None and age[u] >= age[i]:
            continue  # u's own head is as old: it goes first
        if wi > widest[u] or f[u] + f[i] + wi > ceil[u]:
            continue  # u's rules could never start it: it keeps its own class's chances
        f[u], f[i] = f[u] + f[i], 0
        d[u] += wi  # _read counts no demand for a class with no head
        w[u], w[i], d[i] = wi, None, 0
        went_up[i] = True
        moved[names[u]] = names[i]
    return (
        dict(zip(names, f, strict=True)),
        dict(zip(names, w, strict=True)),
        dict(zip(names, d, strict=True)),
        moved,
    )


def next_class(
    table: ClassTable,
    capacity: int,
    in_flight: Mapping[str, int],
    waiting_width: Mapping[str, int | None],
    *,
    demand: Mapping[str, int] | None = None,
    waited_ms: Mapping[str, int] | None = None,
) -> str | None:
    """The class whose head job should start now, or None if no class may start.

    ``waited_ms``: how long each class's head has waited, for classes that declare
    ``max_wait`` (aging, rules A1-A3); without it nothing ages."""
    if waited_ms is None or all(c.max_wait is None for c in table):
        return allocate(table, capacity, in_flight, waiting_width, demand=demand).chosen
    f, w, d, moved = move_aged(table, capacity, in_flight, waiting_width, waited_ms, demand=demand)
    chosen = allocate(table, capacity, f, w, demand=d).chosen
    return moved.get(chosen, chosen) if chosen is not None else None


def may_start(
    table: ClassTable,
    capacity: int,
    in_flight: Mapping[str, int],
    waiting_width: Mapping[str, int | None],
    name: str,
    *,
    demand: Mapping[str, int] | None = None,
) -> bool:
    """Whether class ``name`` may start its head job now (it may not be the one served first)."""
    if name not in table:
        raise ValueError(f"unknown service class: {name!r}")
    return allocate(table, capacity, in_flight, waiting_width, demand=demand)[name].may_start
