"""Rate keys in the simulator: token buckets, adaptive limits and pauses on throttle keys,
waited on tenant-fair; and the upstream a key's jobs call.

:class:`FairRateKeys` is the fast path of the composition the rate contract states
(``docs/contracts/rates.md``, "Blocking and waking", "When an attempt ends"): the
concurrency keys of :class:`fairlane.sim.keys.FairKeys`, which it extends (limits,
offers, tenant-fair waiter groups), with, per key, an optional rate
(``fairlane.policy.rates.Rate``, its bucket a ``Bucket``), an optional ``Adaptive``
concurrency limit and a pause. Every bucket and adaptive step is the policy's own
function (``fits``, ``take``, ``correct``, ``pause``, ``due_at``, ``adaptive_cut`` /
``adaptive_grow``); only the bookkeeping around them (lists by key index, heaps of
waiter groups) is this module's, held to a naive model of the rules by
``tests/sim/test_rates.py``. The clock is the engine's, in integer milliseconds, set
with :meth:`FairRateKeys.at` before each call.

* A job's cost on key ``k`` is ``job_cost(rate, units)``: 1, or its tenant's declared
  units on a ``cost="units"`` key.
* Key ``k`` **blocks** a job iff ``room(k) = limit - in_use - offers <= 0``, or ``k`` is
  paused, or ``k`` has a rate and (the job does not ``fit``, or ``k`` has waiters and
  is not the key being woken: no barging). A pause blocks a key without a rate too
  (the issue: ``Throttled`` pauses any key the job holds).
* An arrival no key blocks takes a slot on every key and its cost on every rate key;
  otherwise it parks in its tenant's group on the first blocking key (key order:
  sorted names). Parking on (or moving to) a key blocked by its rate or pause, not by
  room, makes it due at ``min(due, due_at(.., its cost, now))`` (the pause's end for a
  key without a rate).
* **Wake** of ``k``: while it has waiters and room, the least ``(tag, tenant)`` group's
  head: if ``k`` is paused or the head does not fit, ``k`` is due at its ``due_at``
  and the wake stops; else the head leaves; blocked elsewhere it moves there
  (uncharged), else it takes one offer on each of its keys and its cost on each rate
  key, ``V = max(V, tag)``, and its tenant's tag grows by ``c / weight`` (``c`` its cost
  on ``k`` if ``k`` has a rate, else the lane's charge, ``cost_of``). A wake that does
  not stop on a head clears ``k``'s due. Due keys are :attr:`FairRateKeys.timers` (a heap
  of ``(due, name, key)``; stale entries are skipped), which the engine fires in due
  order, then key order.
* A woken job converts its offers if every key has ``in_use < limit`` (the tokens were
  taken at the wake); else it gives them back (its tokens refunded) and parks again.
* **End of an attempt** (:meth:`FairRateKeys.end`), in order: the correction of each
  ``cost="units"`` key by ``units - used`` when the attempt reported ``used``; adaptive
  growth on success (a raised limit wakes the key); the pushback (:meth:`push_back`:
  pause until ``until``, an adaptive cut on each pushback, a key with waiters due at
  the pause's end); the release of the slots, which wakes the keys.

:class:`Upstream` is the service behind a key (``UpstreamSpec``): the same policy
buckets for its calls per second and tokens per minute, taken at a call's start; a call
that does not fit both takes nothing and gets a Retry-After.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import Any

from fairlane.policy.rates import (
    Adaptive,
    Bucket,
    Rate,
    adaptive_cut,
    adaptive_grow,
    adaptive_limit,
    correct,
    due_at,
    fits,
    job_cost,
    level,
    pause,
    take,
)
from fairlane.sim.keys import FairKeys, _took
from fairlane.sim.scenario import UpstreamSpec

__all__ = ["FairRateKeys", "Upstream"]

_TEN, _OFF = 1, 7  # the job fields used here (fairlane.sim.world's)
_NONE = -1


class FairRateKeys(FairKeys):
    """Throttle keys with rates, adaptive limits and pauses; waiters by tenant, fair (the
    groups, tags and offers of :class:`FairKeys`)."""

    __slots__ = ("adaptive", "bucket", "cuts", "debt", "due", "key_names", "ledger", "low",
                 "now", "pauses", "pushbacks", "rate", "refunded", "taken", "timers",
                 "units", "value")  # fmt: skip

    def __init__(
        self,
        limits: Sequence[int],
        keys_of: Sequence[tuple[int, ...]],
        waited: list[list[int]],
        *,
        names: Sequence[str],
        key_names: Sequence[str],
        weights: Sequence[float],
        cost_of: Callable[[Any], float],
        rates: Sequence[Rate | None],
        adaptive: Sequence[Adaptive | None],
        units: Sequence[float],
    ) -> None:
        super().__init__(limits, keys_of, waited, names=names, weights=weights, cost_of=cost_of)
        n = len(limits)
        self.key_names, self.units = key_names, units
        self.rate = list(rates)
        # a fresh key's bucket is full; a key without a rate keeps only its pause here
        self.bucket = [Bucket.full(r, 0) if r is not None else Bucket(0.0, 0) for r in rates]
        self.adaptive = list(adaptive)
        self.value = [float(a.max) if a is not None else 0.0 for a in adaptive]
        for k, a in enumerate(adaptive):
            if a is not None:
                self.limit[k] = adaptive_limit(self.value[k])
        self.low = list(self.limit)
        """The least concurrency limit each key had in force."""
        self.due: list[int | None] = [None] * n
        self.timers: list[tuple[int, str, int]] = []
        self.now = 0
        self.taken, self.refunded, self.debt = [0.0] * n, [0.0] * n, [0.0] * n
        self.pushbacks, self.cuts = [0] * n, [0] * n
        self.ledger: list[list[tuple[int, float, int]]] = [[] for _ in range(n)]
        """Per rate key: ``(ms, tokens, tenant)``, a take (> 0) or a refund (< 0)."""
        self.pauses: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        """Per key: each pushback's ``(ms, paused until)``."""

    # -- the engine's interface (FairKeys' and the rates') -------------------------------

    def at(self, now: int) -> None:
        """Set the clock (ms) for the calls that follow."""
        self.now = now

    def cost(self, k: int, t: int) -> float:
        """Tenant ``t``'s jobs' cost on key ``k`` (0 on a key without a rate)."""
        rate = self.rate[k]
        return job_cost(rate, self.units[t]) if rate is not None else 0.0

    def take(self, job: Any, out: list[Any]) -> bool:
        """Admit ``job`` on all its keys, or park it at its first blocking key."""
        t = job[_TEN]
        keys = self.keys_of[t]
        if job[_OFF]:  # concurrency only: its tokens were taken at the wake
            return self._convert(job, keys, out)
        for k in keys:
            if self._blocks(k, t, _NONE):
                self._park(k, job)
                return False
        in_use = self.in_use
        for k in keys:
            in_use[k] += 1
        self._take_tokens(keys, t)
        _took(job, keys, self.handoffs, self.waited)
        return True

    def end(
        self,
        job: Any,
        out: list[Any],
        *,
        used: float | None,
        succeeded: bool,
        push: int = _NONE,
        until: int = 0,
    ) -> bool:
        """An attempt of ``job`` ended: correction, adaptive growth, the pushback on key
        ``push`` (until ``until`` ms) and the release, in this order; True iff it cut."""
        t = job[_TEN]
        keys = self.keys_of[t]
        if used is not None:
            for k in keys:
                rate = self.rate[k]
                if rate is not None and rate.units:
                    self._correct(k, self.units[t] - used, t)
        if succeeded:
            for k in keys:
                spec = self.adaptive[k]
                if spec is not None:
                    self.value[k] = value = adaptive_grow(self.value[k], spec)
                    self.set_limit(k, adaptive_limit(value), out)
        cut = self.push_back(push, until) if push != _NONE else False
        self.release(keys, out)
        return cut

    def push_back(self, k: int, until: int) -> bool:
        """Pause ``k`` until ``until`` (ms); an adaptive key is cut. True iff it cut."""
        bucket = self.bucket[k]
        self.bucket[k] = bucket = pause(bucket, until)
        self.pushbacks[k] += 1
        self.pauses[k].append((self.now, bucket.paused_until))
        cut = False
        spec = self.adaptive[k]
        if spec is not None:
            self.value[k] = value = adaptive_cut(self.value[k], spec)
            self.limit[k] = adaptive_limit(value)
            self.low[k] = min(self.low[k], self.limit[k])
            self.cuts[k] += 1
            cut = True
        if self.active[k]:
            self._set_due(k, bucket.paused_until)
        return cut

    def fire(self, out: list[Any]) -> int | None:
        """Wake the key of the earliest timer if it is still due then; the ms it fired."""
        due, _, k = heapq.heappop(self.timers)
        if self.due[k] != due:
            return None  # stale: the key's due moved
        self.due[k] = None
        self.wake(k, out)
        return due

    def next_due(self) -> int | None:
        """The earliest live timer, dropping stale ones."""
        timers = self.timers
        while timers and self.due[timers[0][2]] != timers[0][0]:
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    def wake(self, k: int, out: list[Any]) -> None:
        """Offers to the least-tag groups' heads while ``k`` has room and they fit."""
        active, groups = self.active[k], self.groups[k]
        rate, now = self.rate[k], self.now
        while active and self.room(k) > 0:
            t = active[0][2]
            cost = self.cost(k, t)
            bucket = self.bucket[k]
            if rate is not None and not fits(rate, bucket, cost, now):
                self._set_due(k, due_at(rate, bucket, cost, now))
                return
            if now < bucket.paused_until:
                self._set_due(k, bucket.paused_until)
                return
            job = heapq.heappop(groups[t])[1]
            keys = self.keys_of[t]
            blocker = next((j for j in keys if self._blocks(j, t, k)), _NONE)
            if blocker != _NONE:
                self._move(k, t, blocker, job)
                continue
            charge = cost if rate is not None else self.cost_of(job)
            self._take_tokens(keys, t)
            self._offer(k, t, job, charge, out)
        self.due[k] = None

    # -- the rules' pieces --------------------------------------------------------------

    def _blocks(self, k: int, t: int, waking: int) -> bool:
        if self.limit[k] - self.in_use[k] - self.offers[k] <= 0:
            return True
        rate, bucket = self.rate[k], self.bucket[k]
        if rate is None:
            return self.now < bucket.paused_until
        if not fits(rate, bucket, job_cost(rate, self.units[t]), self.now):
            return True
        return k != waking and bool(self.active[k])

    def _give_back(self, k: int, t: int) -> None:
        self.offers[k] -= 1
        if self.rate[k] is not None:
            self._refund(k, self.cost(k, t), t)

    def _park(self, k: int, job: Any) -> None:
        super()._park(k, job)
        if self.room(k) > 0:  # blocked by its rate or its pause, not by room
            t = job[_TEN]
            rate, bucket = self.rate[k], self.bucket[k]
            due = (
                due_at(rate, bucket, self.cost(k, t), self.now)
                if rate is not None
                else bucket.paused_until
            )
            current = self.due[k]
            if current is None or due < current:
                self._set_due(k, due)

    def _set_due(self, k: int, due: int) -> None:
        self.due[k] = due
        heapq.heappush(self.timers, (due, self.key_names[k], k))

    def _take_tokens(self, keys: tuple[int, ...], t: int) -> None:
        now = self.now
        for k in keys:
            rate = self.rate[k]
            if rate is not None:
                cost = job_cost(rate, self.units[t])
                self.bucket[k] = take(rate, self.bucket[k], cost, now)
                self.taken[k] += cost
                self.ledger[k].append((now, cost, t))

    def _refund(self, k: int, cost: float, t: int) -> None:
        """Give ``cost`` back to key ``k`` (offers returned, or a correction's refund)."""
        rate = self.rate[k]
        assert rate is not None
        before = level(rate, self.bucket[k], self.now)
        self.bucket[k] = correct(rate, self.bucket[k], cost, self.now)
        back = level(rate, self.bucket[k], self.now) - before  # capped at the burst
        self.refunded[k] += back
        if back:
            self.ledger[k].append((self.now, -back, t))

    def _correct(self, k: int, delta: float, t: int) -> None:
        if delta > 0:
            self._refund(k, delta, t)
        elif delta < 0:
            rate = self.rate[k]
            assert rate is not None
            self.bucket[k] = correct(rate, self.bucket[k], delta, self.now)
            self.debt[k] -= delta


class Upstream:
    """The service behind a key: a call fits its buckets at its start, or gets a 429."""

    __slots__ = ("calls", "rps", "spec", "tokens", "tpm")

    def __init__(self, spec: UpstreamSpec) -> None:
        self.spec, self.rps, self.tpm = spec, spec.rps, spec.tpm
        self.calls = Bucket.full(spec.rps, 0) if spec.rps is not None else None
        self.tokens = Bucket.full(spec.tpm, 0) if spec.tpm is not None else None

    def largest(self, tokens: float) -> float:
        """A call's tokens as the upstream counts them: at most its token burst, so that
        every call can fit once the bucket is full."""
        return min(tokens, self.tpm.capacity) if self.tpm is not None else tokens

    def call(self, now: int, tokens: float) -> float:
        """A call of ``tokens`` at ``now`` (ms): 0.0 if served (it takes from both
        buckets), else the Retry-After in seconds of its 429 (it takes nothing)."""
        rps, tpm, calls, held = self.rps, self.tpm, self.calls, self.tokens
        due = 0
        if rps is not None and calls is not None and not fits(rps, calls, 1.0, now):
            due = due_at(rps, calls, 1.0, now)
        if tpm is not None and held is not None and not fits(tpm, held, tokens, now):
            due = max(due, due_at(tpm, held, tokens, now))
        if not due:
            if rps is not None and calls is not None:
                self.calls = take(rps, calls, 1.0, now)
            if tpm is not None and held is not None:
                self.tokens = take(tpm, held, tokens, now)
            return 0.0
        after = (due - now) / 1000.0
        step = self.spec.retry_step
        if step > 0:
            after = max(step, math.ceil(after / step - 1e-9) * step)
        return after
