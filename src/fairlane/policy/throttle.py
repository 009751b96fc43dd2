"""Per-key throttles: concurrency limits and rates, tenant-fair waiting, offers.

A job names a set of keys, each with a concurrency limit (``model:big`` <= 2,
``tenant:acme`` <= 10, ``doc:884`` <= 4, or ``Adaptive(max, min)``) and/or a rate
(``Rate(90_000, per=60, cost="units")``). It runs only while it holds one slot on
*every* key it names, and it holds slots only while it also holds a lane slot.
:class:`Throttles` is the pure model of that primitive: no Redis, time passed in (ms).
The store runs the same steps as one atomic script each (``store/lua/throttle.lua``
with ``rates.lua``); ``docs/contracts/rates.md`` is the contract both follow, and
``fairlane.policy.ratekeys`` holds the rate state and the choices made where it is
silent.

State of a key ``k``: its limit, ``in_use(k)`` (holders: jobs that run), ``o(k)``
(offers: woken waiters on their way back to a lane slot), a virtual time ``V_k`` and
its waiters, grouped by tenant; ``room(k) = limit(k) - in_use(k) - o(k)``. A key with
a rate also has a bucket (``fairlane.policy.rates``), maybe a pause, and maybe a due
time. A job's cost ``cost_k`` on a rate key is 1 or its rate cost ``units``
(``ratekeys.key_cost``).

Rules
-----
* **Key order.** A job's keys (those of its limits and rates) are taken in sorted
  (code point) order. "The first blocking key" is the first in that order that blocks.
* **Limits in force.** Every arrival (``try_acquire`` of a job holding no offers)
  carries a limit for each key of its ``keys`` and a rate for each of its ``rates``,
  which become the key's at once: the most recent given applies (a key named only in
  ``rates`` keeps its limit, or has ``UNLIMITED``; one named only in ``keys`` keeps its
  rate). An adaptive key's limit is ``floor(value)``. A waiter's limits are not applied
  again when it is woken or when its offers are converted. A key is forgotten (limit,
  rate, tags, all) once no job holds it, is offered it or waits naming it.
* **Blocking.** Key ``j`` blocks a job at ``now`` iff ``room(j) <= 0``, or ``j`` is
  paused (with or without a rate), or ``j`` has a rate and (the job does not fit its
  bucket, or ``j`` has waiters and is not the key being woken). The last clause keeps a
  job that happens to fit from overtaking waiters that need more tokens (no barging).
* **Taking keys happens only with a lane slot** (``try_acquire``, called by dispatch
  for a job that has its lane slot). A job holding offers converts them into holds
  (``o -= 1``, ``in_use += 1`` on each key) iff every one of its keys has ``in_use <
  limit`` (its tokens were taken when it was woken); a job holding none is admitted
  iff no key blocks it, and takes one slot on each key and ``cost_j`` tokens on each
  rate key. An admission draws a grant token. Otherwise the job takes nothing (offers
  it held are given back) and parks in its tenant's group on its first blocking key.
  Dispatch does not charge the job's tenant in the lane's fair queue for a job that
  parks.
* **Waiter order.** Within a tenant group: highest ``priority`` first, then lowest
  ``seq`` (a deadline order, ``< 0``, before every FIFO number:
  ``fairlane.policy.deadlineorder``), then job id. Between a key's groups: start-time
  fair queuing with the charge and the tenant's weight. A group that becomes non-empty
  starts at ``S_k(t) = max(F_k(t), V_k)`` (``F_k(t)`` its finish tag, if any). The next
  group is the one with the least ``(S_k(t), t)``.
* **Wake.** While ``room(k) > 0``: if ``k`` is paused it is due at the pause's end and
  the wake stops; if nobody waits it stops; take the head ``h`` of the least-tag group.
  If ``k`` has a rate and ``h`` does not fit it, ``k`` is due at ``due_at(h)`` exactly
  and the wake stops. Otherwise ``h`` is taken out and tried on
  all its keys: if another key blocks it, it *moves* (holding nothing, uncharged) to
  its tenant's group there; else it is *woken*: one offer on each of its keys (a
  :class:`Wake`), ``cost_j`` tokens on each rate key, ``V_k = max(V_k, S_k(t))`` and
  ``S_k(t) += c / weight(t)``, where ``c`` is ``cost_k(h)`` if ``k`` has a rate, else
  the charge given when it parked (1, or its expected cost in the lane's cost mode).
  The caller puts a woken job back into its tenant's queue of its class. A group left
  empty keeps ``S`` as ``F_k(t)``; a finish tag ``<= V_k`` carries nothing and is
  deleted. A key is woken after a release, a raised limit or changed rate (an
  arrival's, before the arrival is tried: the waiters came first), offers given back,
  and when it is due (``wake_due``, which ``fetch`` runs first).
* **Due.** A job that parks on, or moves to, a paused key makes it due no later than
  the pause's end, and one blocked by a key's rate (it does not fit the bucket, or it
  is held back by the key's waiters) no later than ``due_at`` of its own cost; a waiter
  leaving a rate key that keeps waiters makes it due now; a pushback makes a key with
  waiters due no earlier than ``until``. Nothing polls: the due set is the only timer.
* **An attempt ends** (``push_back``, then ``release``): a pushback pauses the key
  (and cuts an adaptive key: each pushback is a call the upstream refused); then each
  units key
  is corrected by ``cost - used``, each adaptive key grows after a success, and the
  slots are freed and the keys woken (a limit the growth raised included).
* **Offers given back** (``cancel``, or converting after a lowered limit) refund
  ``cost_j`` on each rate key and wake the job's keys.
* **Fencing.** ``release(job, token)`` frees the slots of the job's current grant
  only, so a late duplicate (from a reclaimed run) is a no-op. ``cancel`` removes a
  waiter or gives a woken job's offers back (cancel, expiry); ``forget`` does whichever
  applies, or releases. All are idempotent.

Invariants (between operations, at the time of the last one)
------------------------------------------------------------
I1. *One state.* A known job either holds a slot on each of its keys (it runs), or
    holds one offer on each (it waits in its lane), or holds nothing and is in exactly
    one tenant group of exactly one key.
I2. *Never over the limit.* Every hold and every offer on ``k`` is made with room for
    it under the limit in force: an offer with ``room(k) > 0``, a hold with ``room(k) >
    0`` or (converting an offer) ``in_use(k) < limit(k)``. So ``in_use + o <= limit``
    unless a limit was lowered (or an adaptive key cut), which preempts nobody and
    makes nothing new until the excess drains. Every take of tokens is made with a fit.
I3. *Work conservation, no barging.* A key with waiters has no room, or it is due no
    later than its pause's end and no later than its head's fit time (every waiter
    that parks there lowers the due to its own fit time, and a wake that stops sets it
    to the head's).

Proofs
------
* **No lost wake-ups, no barging.** I3 holds after every operation: a job parks only
  on a key that blocks it; by room, the key has none; by a pause or its bucket, it
  makes the key due; by waiters only, the key has room and waiters already, so (I3) it
  was due. Room grows only by a release, a raised limit or offers given back, and a fit
  time moves earlier only by a refund or a changed rate: every key so changed that has
  waiters is woken (a release after a correction included). A wake, and ``wake_due``
  (the only remover of a due), end with no room, nobody waiting, or the key due again.
  So every waiter on a key with room is woken at its key's due at the latest, and an
  arrival that finds room, no pause and its fit finds nobody waiting on a rate key,
  nor (by I3) on a key without one: it overtakes nobody.
* **No deadlock.** A waiter holds nothing; a woken job holds only offers, which its
  next dispatch converts in one step or gives back, and a lane slot does not wait on a
  key. So the wait-for graph has edges only from waiters to holders and offers, none
  out of them: no cycle. A bucket always refills: a cost is at most the burst.
* **Bounded work.** A wake of ``k`` pops the head of one of its groups and either
  offers (room shrinks by one) or moves it to a key ``j`` that blocks it; within an
  operation room and tokens of ``j`` cannot grow after its own wake, so each waiter is
  tried at most once per operation, and a wake of ``k`` pops at most ``|waiters(k)|``
  jobs.
* **Fairness bound (start-time fair queuing on each key).** Let ``c_x`` be the largest
  charge of tenant ``x``'s jobs (its largest cost on ``k`` when ``k`` has a rate) and
  ``w_x`` its weight (fixed over the window). Every active group's tag is ``>= V_k``
  (groups start at ``>= V_k``; ``V_k`` rises only to the least active tag), and a
  tenant's tag is at most one charge above ``V_k`` when it is next served (``S <= V +
  c/w`` right after a wake, and a finish tag is such a tag). Let tenant ``i`` be
  continuously backlogged on ``k`` over a window of wakes and ``W_x`` the charge woken
  for ``x`` in it. Each tag ``j`` is served at is at most ``i``'s tag then, so ``W_j /
  w_j <= W_i / w_i + c_i / w_i + c_j / w_j``. Summing over the tenants served in the
  window, with ``w = w_i + sum w_j``::

      W_i >= (w_i / w) * W - (c_i + sum_{j != i} c_j)

  A backlogged tenant loses at most one maximal charge per other tenant plus one of its
  own against its weight share of the key's wakes (``tests/policy/test_throttle_bound``
  checks it at every prefix of random runs). On a rate key the wakes are its tokens.

Where it is kept
----------------
:class:`Throttles` holds the operations; where a blocked job waits and how a key's room
goes to its waiters are ``fairlane.policy.throttlewaiters``'; the state and its reads are
``fairlane.policy.throttlekeys``'.

Redis twin
----------
``store/lua/throttle.lua`` and ``rates.lua`` keep the same state under the app's hash
tag (key patterns and fields in ``fairlane.store.keys``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from fairlane.policy.deadlineorder import DEADLINE_SPAN
from fairlane.policy.ratekeys import UNLIMITED, key_cost
from fairlane.policy.rates import Adaptive, Rate, adaptive_limit
from fairlane.policy.throttlekeys import KeyState, KeyStatistics, ThrottleStatistics, Waiter
from fairlane.policy.throttlewaiters import ThrottleWaiters, Wake

__all__ = [
    "UNLIMITED",
    "Acquired",
    "KeyStatistics",
    "Parked",
    "ThrottleStatistics",
    "Throttles",
    "Wake",
]


@dataclass(frozen=True, slots=True)
class Acquired:
    """The job (with its lane slot) holds a slot on each of ``keys``."""

    job_id: str
    token: int
    keys: tuple[str, ...]
    wakes: tuple[Wake, ...] = ()
    """Waiters woken first because this arrival raised a limit or changed a rate."""


@dataclass(frozen=True, slots=True)
class Parked:
    """The job holds nothing and waits in its tenant's group on ``key``."""

    job_id: str
    key: str
    wakes: tuple[Wake, ...] = ()
    """Waiters woken on the way (raised limits, offers this job gave back)."""


def _check_given(keys: Mapping[str, int | Adaptive], rates: Mapping[str, Rate]) -> None:
    for key, limit in keys.items():
        if not isinstance(limit, Adaptive) and limit < 0:
            raise ValueError(f"limit for {key!r} must be >= 0, got {limit}")
    for key, rate in rates.items():
        if not isinstance(rate, Rate):
            raise TypeError(f"rate for {key!r} must be a Rate, got {rate!r}")


class Throttles(ThrottleWaiters):
    """Per-key concurrency limits and rates with tenant-fair waiting and offers."""

    # -- operations -------------------------------------------------------------------

    def try_acquire(
        self,
        job_id: str,
        keys: Mapping[str, int | Adaptive],
        priority: int,
        seq: int,
        *,
        tenant: str = "",
        charge: float = 1.0,
        rates: Mapping[str, Rate] | None = None,
        units: float = 1.0,
        now: int = 0,
    ) -> Acquired | Parked:
        """Dispatch of ``job_id`` with its lane slot at ``now``: convert its offers, or
        admit it on all of ``keys`` (key -> limit) and ``rates`` (key -> rate) at once,
        or park it. ``units`` is its rate cost. A job holding offers keeps the keys,
        limits and rate cost it was parked with (``keys`` and ``rates`` are not
        applied)."""
        if job_id in self._held or job_id in self._parked:
            raise ValueError(f"job {job_id!r} already holds or waits for slots")
        if seq < -DEADLINE_SPAN:
            raise ValueError(f"seq must be a FIFO number or a deadline order, got {seq}")
        if charge < 0:
            raise ValueError(f"charge must be >= 0, got {charge}")
        if not math.isfinite(units) or units < 0:
            raise ValueError(f"units must be a finite number >= 0, got {units}")
        rates = {} if rates is None else rates
        offered = self._offered.pop(job_id, None)
        if offered is not None:
            entry = (-priority, seq, job_id)
            waiter = Waiter(offered, entry, tenant, charge, "", self._units[job_id], now)
            return self._convert(job_id, waiter, now)
        _check_given(keys, rates)
        order = tuple(sorted({*keys, *rates}))
        raised = [key for key in order if self._apply(key, keys.get(key), rates.get(key))]
        self._units[job_id] = float(units)
        if rates or any(isinstance(limit, Adaptive) for limit in keys.values()):
            self._rated.add(job_id)
        wakes: list[Wake] = []
        for key in raised:
            self._wake(key, wakes, now)
        found = self._blocker(order, units, now)
        if found is None:
            for key in order:
                self._keys[key].in_use += 1
            self._take(job_id, order, units, now)
            return Acquired(job_id, self._grant(job_id, order), order, tuple(wakes))
        entry = (-priority, seq, job_id)
        self._counts["parked"] += 1
        self._enter(job_id, Waiter(order, entry, tenant, charge, found[0], units, now), found[1])
        return Parked(job_id, found[0], tuple(wakes))

    def release(
        self,
        job_id: str,
        token: int | None = None,
        *,
        now: int = 0,
        used: float | None = None,
        succeeded: bool = False,
    ) -> list[Wake]:
        """The attempt of ``job_id`` ended at ``now``: correct each units key by what it
        ``used`` (when known, ``>= 0``), grow each adaptive key after a success, free
        the job's slots and wake each freed key's waiters.

        With ``token``, only the grant with that token is released. Releasing a job
        that holds nothing (or under another token) changes nothing and returns ``[]``.
        """
        held = self._held.get(job_id)
        if held is None or (token is not None and held[0] != token):
            return []
        del self._held[job_id]
        self._counts["released"] += 1
        keys = held[1]
        cost_units = self._units.pop(job_id)
        rated = job_id in self._rated
        self._rated.discard(job_id)
        for key in keys if rated else ():
            state = self._keys[key]
            rate = state.rate
            if rate is not None and rate.units and used is not None and used >= 0:
                cost = key_cost(rate, cost_units)
                if cost != used:
                    self._rates.correct(key, rate, cost - used, now)
            if succeeded and state.adaptive is not None:
                # the release's wake below is the one a raised limit needs
                state.limit = adaptive_limit(self._rates.grow(key, state.adaptive))
        for key in keys:
            self._keys[key].in_use -= 1
        wakes: list[Wake] = []
        self._wake_all(keys, wakes, now)
        self._unref(keys)
        return wakes

    def push_back(
        self, job_id: str, key: str, until: int, *, now: int, token: int | None = None
    ) -> bool:
        """The upstream behind ``key`` refused the attempt of ``job_id`` (which holds
        ``key``; call it before :meth:`release`): ``key`` is paused until ``until``, an
        adaptive key is cut, and a key with waiters is due no earlier than the pause's
        end. Returns whether it cut; ``False`` and nothing
        done for a job that does not hold ``key`` (under ``token``)."""
        held = self._held.get(job_id)
        if held is None or (token is not None and held[0] != token) or key not in held[1]:
            return False
        state = self._keys[key]
        cut = False
        self._rates.pause(key, until, now)
        if state.adaptive is not None:
            state.limit = adaptive_limit(self._rates.cut(key, state.adaptive))
            cut = True
        if state.groups:
            self._rates.raise_due(key, until)
        return cut

    def cancel(self, job_id: str, *, now: int = 0) -> list[Wake]:
        """A waiting job leaves (cancelled, expired): out of its group (a rate key that
        keeps waiters is due now, for its new head), or its offers and tokens given back
        (and their keys woken). Nothing for a job that does neither."""
        waiter = self._parked.pop(job_id, None)
        if waiter is not None:
            state = self._keys[waiter.at]
            state.leave(waiter.tenant, waiter.entry)
            if state.rate is not None and state.groups:
                self._rates.lower_due(waiter.at, now)
            self._unref(waiter.keys)
            del self._units[job_id]
            self._rated.discard(job_id)
            self._counts["cancelled"] += 1
            return []
        offered = self._offered.pop(job_id, None)
        if offered is None:
            return []
        self._counts["cancelled"] += 1
        wakes: list[Wake] = []
        self._give_back(job_id, offered, self._units.pop(job_id), wakes, now)
        self._rated.discard(job_id)
        self._unref(offered)
        return wakes

    def forget(self, job_id: str, *, now: int = 0) -> list[Wake]:
        """Crash or reclaim: release the job's slots (no correction, no growth), cancel
        its wait or give its offers back, whichever applies. Idempotent."""
        if job_id in self._held:
            return self.release(job_id, now=now)
        return self.cancel(job_id, now=now)

    def wake_due(self, now: int) -> list[Wake]:
        """Wake the keys due at or before ``now`` (``fetch`` runs it first)."""
        wakes: list[Wake] = []
        for key in self._rates.ready(now):
            self._rates.drop_due(key)
            if key in self._keys:
                self._wake(key, wakes, now)
        return wakes

    def next_due(self) -> int | None:
        """When the next key is due (ms), or ``None``: idle workers sleep until then."""
        return self._rates.next_due()

    # -- steps ------------------------------------------------------------------------

    def _apply(self, key: str, limit: int | Adaptive | None, rate: Rate | None) -> bool:
        """Make an arrival's limit and rate for ``key`` the ones in force; returns
        whether that raised its limit or changed its rate while it has waiters."""
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = KeyState(limit=UNLIMITED)
            fresh = True
        else:
            fresh = False
        before, rate_before = state.limit, state.rate
        if isinstance(limit, Adaptive):
            state.adaptive = limit
            state.limit = adaptive_limit(self._rates.value(key, limit))
        elif limit is not None:
            state.adaptive = None
            state.limit = limit
        if rate is not None:
            state.rate = rate
        state.refs += 1
        changed = state.limit > before or (
            rate is not None and rate_before is not None and rate != rate_before
        )
        return changed and not fresh and bool(state.groups)

    def _convert(self, job_id: str, waiter: Waiter, now: int) -> Acquired | Parked:
        keys = waiter.keys
        if all(self._keys[k].in_use < self._keys[k].limit for k in keys):
            for key in keys:
                state = self._keys[key]
                state.offers -= 1
                state.in_use += 1
            return Acquired(job_id, self._grant(job_id, keys), keys)
        # a limit was lowered under the offer: give it and its tokens back, wait again
        for key in keys:
            self._keys[key].offers -= 1
        self._refund(job_id, keys, waiter.units, now)
        found = self._blocker(keys, waiter.units, now)
        assert found is not None  # the key whose in_use reached its limit
        waiter.at = found[0]
        self._counts["parked"] += 1
        self._enter(job_id, waiter, found[1])
        wakes: list[Wake] = []
        self._wake_all(keys, wakes, now)
        return Parked(job_id, found[0], tuple(wakes))

    def _grant(self, job_id: str, keys: tuple[str, ...]) -> int:
        self._token += 1
        self._held[job_id] = (self._token, keys)
        self._counts["acquired"] += 1
        return self._token

    def _unref(self, keys: tuple[str, ...]) -> None:
        for key in keys:
            state = self._keys[key]
            state.refs -= 1
            if state.refs == 0:
                del self._keys[key]
