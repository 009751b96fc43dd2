"""Per-key concurrency throttles: tenant-fair waiting, offers, holds taken with a lane slot.

A job names a set of keys, each with a limit (``model:big`` <= 2, ``tenant:acme`` <=
10, ``doc:884`` <= 4). It runs only while it holds one slot on *every* key it names,
and it holds slots only while it also holds a lane slot. :class:`Throttles` is the pure
model of that primitive: no Redis, no clock. The store runs the same steps as one
atomic script each (``store/lua/throttle.lua``).

State of a key ``k``: its limit, ``in_use(k)`` (holders: jobs that run), ``o(k)``
(offers: woken waiters on their way back to a lane slot), a virtual time ``V_k`` and
its waiters, grouped by tenant. ``room(k) = limit(k) - in_use(k) - o(k)``.

Rules
-----
* **Key order.** A job's keys are taken in sorted (code point) order. "The first full
  key" always means the first in that order with ``room <= 0``.
* **Limits in force.** Every arrival (``try_acquire`` of a job holding no offers) carries
  a limit for each of its keys, which becomes the key's limit at once: the most recent
  limit given applies. A waiter's limits are not applied again when it is woken or when
  its offers are converted. A key is forgotten (limit, tags, all) once no job holds it,
  is offered it or waits naming it.
* **Taking keys happens only with a lane slot** (``try_acquire``, called by dispatch for
  a job that has its lane slot). A job holding offers converts them into holds (``o -=
  1``, ``in_use += 1`` on each key) iff every one of its keys has ``in_use < limit``; a
  job holding none is admitted iff ``room(k) > 0`` on every key it names, and takes one
  slot on each. An admission draws a grant token. Otherwise the job takes nothing
  (offers it held are given back) and parks in its tenant's group on its first full
  key. Dispatch does not charge the job's tenant in the lane's fair queue for a job
  that parks.
* **Waiter order.** Within a tenant group: highest ``priority`` first, then lowest
  ``seq``, then job id. Between a key's groups: start-time fair queuing with the lane's
  charge and the tenant's weight. A group that becomes non-empty starts at ``S_k(t) =
  max(F_k(t), V_k)`` (``F_k(t)`` its finish tag, if any). The next group is the one with
  the least ``(S_k(t), t)``.
* **Wake.** While ``room(k) > 0`` and ``k`` has waiters, the head of the least-tag group
  is taken out and tried on all its keys: if some key ``j`` has ``room(j) <= 0`` it
  *moves* (holding nothing, uncharged) to its tenant's group on ``j``; otherwise it is
  *woken*: it gets one offer on each of its keys (a :class:`Wake`), ``V_k = max(V_k,
  S_k(t))`` and ``S_k(t) += charge / weight(t)`` (``charge`` as given when it parked:
  1, or its expected cost in the lane's cost mode; ``weight`` the tenant's weight now).
  The caller puts a woken job back into its tenant's queue of its class. A group left
  empty keeps ``S`` as ``F_k(t)``; a finish tag ``<= V_k`` carries nothing and is
  deleted. A key is woken after a release, a raised limit and offers given back; an
  arrival's raised limits wake before the arrival is tried (the waiters came first).
* **Fencing.** ``release(job, token)`` frees the slots of the job's current grant
  only, so a late duplicate (from a reclaimed run) is a no-op. ``cancel`` removes a
  waiter or gives a woken job's offers back (cancel, expiry); ``forget`` does whichever
  applies, or releases. All are idempotent.

Invariants (between operations)
-------------------------------
I1. *One state.* A known job either holds a slot on each of its keys (it runs), or
    holds one offer on each (it waits in its lane), or holds nothing and is in exactly
    one tenant group of exactly one key.
I2. *Never over the limit.* Every hold and every offer on ``k`` is made with room for
    it under the limit in force: an offer with ``room(k) > 0``, a hold with ``room(k) >
    0`` or (converting an offer) ``in_use(k) < limit(k)``. So ``in_use + o <= limit``
    unless a limit was lowered, which preempts nobody and makes nothing new until the
    excess drains.
I3. *Work conservation, no barging.* A key with waiters has no room: ``waiters(k) !=
    [] => room(k) <= 0``.

Proofs
------
* **No lost wake-ups, no barging.** A waiter that could take all its keys would sit on
  a key with room, contradicting I3. I3 holds after every operation: an arrival parks
  only on a key without room; room grows only by a release, a raised limit or offers
  given back, and every key that so gains room and has waiters is woken until it has no
  room or no waiters; otherwise within an operation room only shrinks and waiters are
  added only to keys without room. An arrival that finds room finds nobody waiting, so
  it overtakes nobody.
* **No deadlock.** A waiter holds nothing; a woken job holds only offers, which its
  next dispatch converts in one step or gives back, and a lane slot does not wait on a
  key. So the wait-for graph has edges only from waiters to holders and offers, none
  out of them: no cycle.
* **Bounded work.** A wake of ``k`` pops the head of one of its groups and either
  offers (room shrinks by one) or moves it to a key ``j`` without room; within an
  operation room of ``j`` cannot grow after its own wake, so each waiter is tried at
  most once per operation, and a wake of ``k`` pops at most ``|waiters(k)|`` jobs.
* **Fairness bound (start-time fair queuing on each key).** Let ``c_x`` be the largest
  charge of tenant ``x``'s jobs and ``w_x`` its weight (fixed over the window). Every
  active group's tag is ``>= V_k`` (groups start at ``>= V_k``; ``V_k`` rises only to
  the least active tag), and a tenant's tag is at most one charge above ``V_k`` when
  it is next served (``S <= V + c/w`` right after a wake, and a finish tag is such a
  tag). Let tenant ``i`` be continuously backlogged on ``k`` over a window of wakes
  and ``W_x`` the charge woken for ``x`` in it. Each tag ``j`` is served at is at most
  ``i``'s tag then, so ``W_j / w_j <= W_i / w_i + c_i / w_i + c_j / w_j``. Summing over
  the tenants served in the window, with ``w = w_i + sum w_j``::

      W_i >= (w_i / w) * W - (c_i + sum_{j != i} c_j)

  A backlogged tenant loses at most one maximal charge per other tenant plus one of its
  own against its weight share of the key's wakes (``tests/policy/test_throttle_bound``
  checks it at every prefix of random runs).

Redis twin
----------
``store/lua/throttle.lua`` keeps the same state under the app's hash tag (key patterns
and fields in ``fairlane.store.keys``).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "Acquired",
    "KeyStatistics",
    "Parked",
    "ThrottleStatistics",
    "Throttles",
    "Wake",
]


@dataclass(frozen=True, slots=True)
class Wake:
    """A waiter woken by ``key``: it holds one offer on each of ``keys`` and goes back
    into its tenant's queue of its lane."""

    job_id: str
    keys: tuple[str, ...]
    key: str


@dataclass(frozen=True, slots=True)
class Acquired:
    """The job (with its lane slot) holds a slot on each of ``keys``."""

    job_id: str
    token: int
    keys: tuple[str, ...]
    wakes: tuple[Wake, ...] = ()
    """Waiters woken first because this arrival raised a limit."""


@dataclass(frozen=True, slots=True)
class Parked:
    """The job holds nothing and waits in its tenant's group on ``key``."""

    job_id: str
    key: str
    wakes: tuple[Wake, ...] = ()
    """Waiters woken on the way (raised limits, offers this job gave back)."""


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
    """Waiters moved by a wake to the group of another full key."""
    released: int
    """Releases (and reclaims) that freed a grant."""
    cancelled: int
    """Waiters removed and offers given back by ``cancel`` or ``forget``."""
    keys: tuple[KeyStatistics, ...]
    """Every live key, sorted."""


_Entry = tuple[int, int, str]  # (-priority, seq, job_id)


@dataclass(slots=True)
class _Key:
    limit: int
    in_use: int = 0
    offers: int = 0
    refs: int = 0  # jobs holding it, offered it or waiting while naming it
    vtime: float = 0.0
    groups: dict[str, list[_Entry]] = field(default_factory=dict)  # tenant -> sorted
    start: dict[str, float] = field(default_factory=dict)  # tenant with waiters -> S
    finish: dict[str, float] = field(default_factory=dict)  # idle tenant -> F (> V)
    epoch: dict[str, int] = field(default_factory=dict)  # tenant -> when its group formed

    def room(self) -> int:
        return self.limit - self.in_use - self.offers

    def waiting(self) -> int:
        return sum(len(g) for g in self.groups.values())


@dataclass(slots=True)
class _Waiter:
    keys: tuple[str, ...]
    entry: _Entry
    tenant: str
    charge: float
    at: str


class Throttles:
    """Per-key concurrency limits with tenant-fair waiting and offers."""

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        self._weights: Mapping[str, float] = {} if weights is None else weights
        self._keys: dict[str, _Key] = {}
        self._held: dict[str, tuple[int, tuple[str, ...]]] = {}  # job -> (token, keys)
        self._offered: dict[str, tuple[str, ...]] = {}  # job -> keys it holds offers on
        self._parked: dict[str, _Waiter] = {}
        self._token = 0
        self._epoch = 0
        self._counts: Counter[str] = Counter()

    # -- operations -------------------------------------------------------------------

    def try_acquire(
        self,
        job_id: str,
        keys: Mapping[str, int],
        priority: int,
        seq: int,
        *,
        tenant: str = "",
        charge: float = 1.0,
    ) -> Acquired | Parked:
        """Dispatch of ``job_id`` with its lane slot: convert its offers, or admit it on
        all of ``keys`` (key -> limit) at once, or park it. A job holding offers keeps
        the keys and limits it was parked with (``keys`` is not applied)."""
        if job_id in self._held or job_id in self._parked:
            raise ValueError(f"job {job_id!r} already holds or waits for slots")
        if seq < 0:
            raise ValueError(f"seq must be >= 0, got {seq}")
        if charge < 0:
            raise ValueError(f"charge must be >= 0, got {charge}")
        offered = self._offered.pop(job_id, None)
        if offered is not None:
            waiter = _Waiter(offered, (-priority, seq, job_id), tenant, charge, at="")
            return self._convert(job_id, waiter)
        for key, limit in keys.items():
            if limit < 0:
                raise ValueError(f"limit for {key!r} must be >= 0, got {limit}")
        order = tuple(sorted(keys))
        raised: list[str] = []
        for key in order:
            state = self._keys.get(key)
            if state is None:
                state = self._keys[key] = _Key(limit=keys[key])
            elif keys[key] > state.limit and state.groups:
                raised.append(key)
            state.limit = keys[key]
            state.refs += 1
        wakes: list[Wake] = []
        for key in raised:
            self._wake(key, wakes)
        blocker = self._first_full(order)
        if blocker is None:
            for key in order:
                self._keys[key].in_use += 1
            return Acquired(job_id, self._grant(job_id, order), order, tuple(wakes))
        self._park(job_id, _Waiter(order, (-priority, seq, job_id), tenant, charge, blocker))
        return Parked(job_id, blocker, tuple(wakes))

    def release(self, job_id: str, token: int | None = None) -> list[Wake]:
        """Free the job's slots and wake each freed key's waiters.

        With ``token``, only the grant with that token is released. Releasing a job
        that holds nothing (or under another token) changes nothing and returns ``[]``.
        """
        held = self._held.get(job_id)
        if held is None or (token is not None and held[0] != token):
            return []
        del self._held[job_id]
        self._counts["released"] += 1
        keys = held[1]
        for key in keys:
            self._keys[key].in_use -= 1
        wakes: list[Wake] = []
        self._wake_all(keys, wakes)
        self._unref(keys)
        return wakes

    def cancel(self, job_id: str) -> list[Wake]:
        """A waiting job leaves (cancelled, expired): out of its group, or its offers
        given back (and their keys woken). Nothing for a job that does neither."""
        waiter = self._parked.pop(job_id, None)
        if waiter is not None:
            self._leave_group(waiter)
            self._unref(waiter.keys)
            self._counts["cancelled"] += 1
            return []
        offered = self._offered.pop(job_id, None)
        if offered is None:
            return []
        self._counts["cancelled"] += 1
        wakes: list[Wake] = []
        self._give_back(offered, wakes)
        self._unref(offered)
        return wakes

    def forget(self, job_id: str) -> list[Wake]:
        """Crash or reclaim: release the job's slots, cancel its wait or give its offers
        back, whichever applies. Idempotent."""
        if job_id in self._held:
            return self.release(job_id)
        return self.cancel(job_id)

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

    # -- steps ------------------------------------------------------------------------

    def _convert(self, job_id: str, waiter: _Waiter) -> Acquired | Parked:
        keys = waiter.keys
        if all(self._keys[k].in_use < self._keys[k].limit for k in keys):
            for key in keys:
                state = self._keys[key]
                state.offers -= 1
                state.in_use += 1
            return Acquired(job_id, self._grant(job_id, keys), keys)
        # a limit was lowered under the offer: give it back and wait again
        for key in keys:
            self._keys[key].offers -= 1
        blocker = self._first_full(keys)
        assert blocker is not None  # the key whose in_use reached its limit
        waiter.at = blocker
        self._park(job_id, waiter)
        wakes: list[Wake] = []
        self._wake_all(keys, wakes)
        return Parked(job_id, blocker, tuple(wakes))

    def _give_back(self, keys: tuple[str, ...], wakes: list[Wake]) -> None:
        for key in keys:
            self._keys[key].offers -= 1
        self._wake_all(keys, wakes)

    def _first_full(self, keys: tuple[str, ...]) -> str | None:
        for key in keys:
            if self._keys[key].room() <= 0:
                return key
        return None

    def _grant(self, job_id: str, keys: tuple[str, ...]) -> int:
        self._token += 1
        self._held[job_id] = (self._token, keys)
        self._counts["acquired"] += 1
        return self._token

    def _park(self, job_id: str, waiter: _Waiter) -> None:
        self._counts["parked"] += 1
        self._enter_group(job_id, waiter)

    def _enter_group(self, job_id: str, waiter: _Waiter) -> None:
        state, tenant = self._keys[waiter.at], waiter.tenant
        group = state.groups.get(tenant)
        if group is None:
            group = state.groups[tenant] = []
            finish = state.finish.pop(tenant, None)
            state.start[tenant] = state.vtime if finish is None else max(finish, state.vtime)
            self._epoch += 1
            state.epoch[tenant] = self._epoch
        bisect.insort(group, waiter.entry)
        self._parked[job_id] = waiter

    def _leave_group(self, waiter: _Waiter) -> None:
        state, tenant = self._keys[waiter.at], waiter.tenant
        group = state.groups[tenant]
        del group[bisect.bisect_left(group, waiter.entry)]
        if not group:
            self._idle(state, tenant)

    @staticmethod
    def _idle(state: _Key, tenant: str) -> None:
        del state.groups[tenant], state.epoch[tenant]
        tag = state.start.pop(tenant)
        if tag > state.vtime:
            state.finish[tenant] = tag

    def _wake_all(self, keys: tuple[str, ...], wakes: list[Wake]) -> None:
        for key in keys:
            state = self._keys[key]
            if state.groups and state.room() > 0:
                self._wake(key, wakes)

    def _wake(self, key: str, out: list[Wake]) -> None:
        """Hand ``key``'s room to its waiters, least tag first, until it has no room or
        nobody waits."""
        state = self._keys[key]
        while state.groups and state.room() > 0:
            tenant = min(state.groups, key=lambda t: (state.start[t], t))
            job_id = state.groups[tenant][0][2]
            waiter = self._parked.pop(job_id)
            state.groups[tenant].pop(0)
            blocker = self._first_full(waiter.keys)
            if blocker is not None:  # blocker != key: key has room
                if not state.groups[tenant]:
                    self._idle(state, tenant)
                waiter.at = blocker
                self._enter_group(job_id, waiter)
                self._counts["moves"] += 1
                continue
            for k in waiter.keys:
                self._keys[k].offers += 1
            self._offered[job_id] = waiter.keys
            tag = state.start[tenant]
            if tag > state.vtime:
                state.vtime = tag
                state.finish = {t: f for t, f in state.finish.items() if f > tag}
            state.start[tenant] = tag + waiter.charge / self._weights.get(tenant, 1.0)
            if not state.groups[tenant]:
                self._idle(state, tenant)
            out.append(Wake(job_id, waiter.keys, key))
            self._counts["wakes"] += 1

    def _unref(self, keys: tuple[str, ...]) -> None:
        for key in keys:
            state = self._keys[key]
            state.refs -= 1
            if state.refs == 0:
                del self._keys[key]
