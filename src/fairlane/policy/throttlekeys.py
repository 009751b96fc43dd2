"""The state of throttle keys and its reads: limits and rates in force, tenant groups.

:class:`fairlane.policy.throttle.Throttles` owns the operations and their rules and
proofs; this is what they work on. :class:`KeyState` is one key: what is in force on it
(a concurrency limit, the adaptive bounds it came from, a rate), its holders and
offers, and its waiters grouped by tenant under start-time fair queuing; it is
forgotten with the key, while what outlives it is ``fairlane.policy.ratekeys``'.
:class:`ThrottleState` holds every key and known job, and answers the reads.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from fairlane.policy.ratekeys import RateCounters, RateKeys
from fairlane.policy.rates import Adaptive, Bucket, Rate

__all__ = [
    "Entry",
    "KeyState",
    "KeyStatistics",
    "ThrottleState",
    "ThrottleStatistics",
    "Waiter",
]

Entry = tuple[int, int, str]  # (-priority, seq, job_id): a group's order


@dataclass(slots=True)
class KeyState:
    limit: int
    in_use: int = 0
    offers: int = 0
    refs: int = 0  # jobs holding it, offered it or waiting while naming it
    vtime: float = 0.0
    groups: dict[str, list[Entry]] = field(default_factory=dict)  # tenant -> sorted
    start: dict[str, float] = field(default_factory=dict)  # tenant with waiters -> S
    finish: dict[str, float] = field(default_factory=dict)  # idle tenant -> F (> V)
    epoch: dict[str, int] = field(default_factory=dict)  # tenant -> when its group formed
    rate: Rate | None = None
    adaptive: Adaptive | None = None  # the bounds the limit in force comes from

    def room(self) -> int:
        return self.limit - self.in_use - self.offers

    def waiting(self) -> int:
        return sum(len(g) for g in self.groups.values())

    def head(self) -> tuple[str, str]:
        """The tenant of the least ``(S, tenant)`` group and its first job."""
        tenant = min(self.groups, key=lambda t: (self.start[t], t))
        return tenant, self.groups[tenant][0][2]

    def join(self, tenant: str, entry: Entry, epoch: int) -> None:
        """Add a waiter; a group that forms starts at ``max(F, V)``."""
        group = self.groups.get(tenant)
        if group is None:
            group = self.groups[tenant] = []
            finish = self.finish.pop(tenant, None)
            self.start[tenant] = self.vtime if finish is None else max(finish, self.vtime)
            self.epoch[tenant] = epoch
        bisect.insort(group, entry)

    def leave(self, tenant: str, entry: Entry) -> None:
        group = self.groups[tenant]
        del group[bisect.bisect_left(group, entry)]
        if not group:
            self.idle(tenant)

    def pop_head(self, tenant: str) -> None:
        self.groups[tenant].pop(0)

    def idle(self, tenant: str) -> None:
        """An emptied group: its start tag stays as its finish tag while above V."""
        del self.groups[tenant], self.epoch[tenant]
        tag = self.start.pop(tenant)
        if tag > self.vtime:
            self.finish[tenant] = tag

    def serve(self, tenant: str, charge: float, weight: float) -> None:
        """The head of ``tenant``'s group (popped) was woken: V up to its tag, the tag
        charged ``charge / weight``."""
        tag = self.start[tenant]
        if tag > self.vtime:
            self.vtime = tag
            self.finish = {t: f for t, f in self.finish.items() if f > tag}
        self.start[tenant] = tag + charge / weight
        if not self.groups[tenant]:
            self.idle(tenant)


@dataclass(slots=True)
class Waiter:
    """A job that holds nothing and waits in its tenant's group on key ``at``."""

    keys: tuple[str, ...]
    entry: Entry
    tenant: str
    charge: float
    at: str
    units: float = 1.0
    since: int = 0  # when it parked (a move keeps it)


@dataclass(frozen=True, slots=True)
class KeyStatistics:
    key: str
    in_use: int
    limit: int
    offers: int
    waiters: int


@dataclass(frozen=True, slots=True)
class ThrottleStatistics:
    """A snapshot of :class:`Throttles`: counters since creation and the live keys."""

    acquired: int
    """Admissions (arrivals and converted offers): grant tokens drawn."""
    parked: int
    """Dispatched jobs that had to wait (again)."""
    wakes: int
    """Waiters woken with offers."""
    moves: int
    """Waiters moved by a wake to the group of another blocking key."""
    released: int
    """Releases (and reclaims) that freed a grant."""
    cancelled: int
    """Waiters removed and offers given back by ``cancel`` or ``forget``."""
    keys: tuple[KeyStatistics, ...]
    """Every live key, sorted."""


class ThrottleState:
    """The state of :class:`fairlane.policy.throttle.Throttles` and its reads."""

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        self._weights: Mapping[str, float] = {} if weights is None else weights
        self._keys: dict[str, KeyState] = {}
        self._held: dict[str, tuple[int, tuple[str, ...]]] = {}  # job -> (token, keys)
        self._offered: dict[str, tuple[str, ...]] = {}  # job -> keys it holds offers on
        self._parked: dict[str, Waiter] = {}
        self._units: dict[str, float] = {}  # known job -> its rate cost
        # jobs that name a rate or adaptive key or took tokens: corrected, grown, refunded
        self._rated: set[str] = set()
        self._rates = RateKeys()
        self._token = 0
        self._epoch = 0
        self._counts: Counter[str] = Counter()

    # -- reads ------------------------------------------------------------------------

    def in_use(self, key: str) -> int:
        state = self._keys.get(key)
        return 0 if state is None else state.in_use

    def offers(self, key: str) -> int:
        state = self._keys.get(key)
        return 0 if state is None else state.offers

    def limit(self, key: str) -> int | None:
        """The limit in force for ``key``, or ``None`` if no job names it."""
        state = self._keys.get(key)
        return None if state is None else state.limit

    def rate(self, key: str) -> Rate | None:
        """The rate in force for ``key``, or ``None`` (none, or no job names it)."""
        state = self._keys.get(key)
        return None if state is None else state.rate

    def bucket(self, key: str) -> Bucket | None:
        """``key``'s bucket as last written, or ``None`` if it never was (full)."""
        return self._rates.stored(key)

    def paused_until(self, key: str) -> int:
        return self._rates.paused_until(key)

    def due(self, key: str) -> int | None:
        """When ``key`` is due to be woken (ms), or ``None``."""
        return self._rates.due(key)

    def adaptive(self, key: str) -> float | None:
        """An adaptive key's value: in force while a job names it as adaptive, else as
        last written (``None`` if never)."""
        state = self._keys.get(key)
        if state is not None and state.adaptive is not None:
            return self._rates.value(key, state.adaptive)
        return self._rates.stored_value(key)

    def adaptive_bounds(self, key: str) -> Adaptive | None:
        """The adaptive bounds in force for ``key``, or ``None`` (a fixed limit)."""
        state = self._keys.get(key)
        return None if state is None else state.adaptive

    def adaptive_written(self, key: str) -> float | None:
        """An adaptive key's value as last written (``None``: never, its max applies)."""
        return self._rates.stored_value(key)

    def rated(self, job_id: str) -> bool:
        """Whether the job is corrected, grown and refunded: it names a rate or an
        adaptive key, or took tokens (the store's ``c:<job>``)."""
        return job_id in self._rated

    def rate_counters(self, key: str) -> RateCounters:
        """Tokens taken, refunded and charged as debt on ``key``, pushbacks, waiters
        woken and the ms they waited (a copy)."""
        c = self._rates.counters(key)
        return RateCounters(c.taken, c.refunded, c.debts, c.pushbacks, c.woken, c.waited_ms)

    def units(self, job_id: str) -> float | None:
        """A known job's rate cost, or ``None``."""
        return self._units.get(job_id)

    def vtime(self, key: str) -> float:
        state = self._keys.get(key)
        return 0.0 if state is None else state.vtime

    def groups(self, key: str) -> dict[str, tuple[str, ...]]:
        """Each tenant waiting on ``key`` -> its jobs in wake order."""
        state = self._keys.get(key)
        if state is None:
            return {}
        return {t: tuple(e[2] for e in g) for t, g in sorted(state.groups.items())}

    def start_tags(self, key: str) -> dict[str, float]:
        state = self._keys.get(key)
        return {} if state is None else dict(sorted(state.start.items()))

    def finish_tags(self, key: str) -> dict[str, float]:
        state = self._keys.get(key)
        return {} if state is None else dict(sorted(state.finish.items()))

    def epoch(self, key: str, tenant: str) -> int | None:
        """A serial number of the moment the tenant's group on ``key`` last became
        non-empty (``None`` while it is empty): equal at two moments iff it stayed
        backlogged in between."""
        state = self._keys.get(key)
        return None if state is None else state.epoch.get(tenant)

    def waiters(self, key: str) -> tuple[str, ...]:
        """The jobs parked on ``key``, by tenant then in each group's order."""
        return tuple(j for g in self.groups(key).values() for j in g)

    def holds(self, job_id: str) -> tuple[str, ...] | None:
        """The keys ``job_id`` holds a slot on, or ``None`` if it holds nothing."""
        held = self._held.get(job_id)
        return None if held is None else held[1]

    def token(self, job_id: str) -> int | None:
        held = self._held.get(job_id)
        return None if held is None else held[0]

    def offered(self, job_id: str) -> tuple[str, ...] | None:
        """The keys a woken job holds offers on, or ``None``."""
        return self._offered.get(job_id)

    def parked_on(self, job_id: str) -> str | None:
        """The key whose group holds ``job_id``, or ``None`` if it is not waiting."""
        waiter = self._parked.get(job_id)
        return None if waiter is None else waiter.at

    def waiter(self, job_id: str) -> tuple[str, int, int, str, float] | None:
        """A parked job's (key, priority, seq, tenant, charge), or ``None``."""
        w = self._parked.get(job_id)
        return None if w is None else (w.at, -w.entry[0], w.entry[1], w.tenant, w.charge)

    def wants(self, job_id: str) -> tuple[str, ...] | None:
        """All the keys a parked job waits to take, or ``None`` if it is not waiting."""
        waiter = self._parked.get(job_id)
        return None if waiter is None else waiter.keys

    def statistics(self) -> ThrottleStatistics:
        keys = tuple(
            KeyStatistics(key, s.in_use, s.limit, s.offers, s.waiting())
            for key, s in sorted(self._keys.items())
        )
        c = self._counts
        return ThrottleStatistics(
            acquired=c["acquired"],
            parked=c["parked"],
            wakes=c["wakes"],
            moves=c["moves"],
            released=c["released"],
            cancelled=c["cancelled"],
            keys=keys,
        )
