"""The rate facet of throttle keys: buckets, pauses, adaptive values and the due timer.

:class:`fairlane.policy.throttle.Throttles` composes the bucket rules of
:mod:`fairlane.policy.rates` with concurrency keys and tenant-fair waiting
(``docs/contracts/rates.md``); :class:`RateKeys` is the state it keeps for that, on the
server's clock (milliseconds, passed in). The rate and the adaptive bounds *in force*
live with the key in ``Throttles`` and are forgotten with it; what is here outlives the
key's references, as ``<prefix>rate:<key>`` and ``<prefix>ratedue`` do in the store:

* a bucket's ``tokens`` as of ``stamp``, written only by a take or a correction; a key
  with none written is full as of now (:meth:`RateKeys.bucket`);
* its pause (``paused_until``), written alone: a pause leaves the tokens unwritten;
* an adaptive key's value, written only by a cut or a growth; a key with none has its
  ``max`` in force, and a value is read clamped to the bounds in force;
* the due set: rate-blocked keys -> the ms ``fetch`` wakes them;
* counters: tokens taken, refunded (what a refund really added, after the cap) and
  charged as debt, pushbacks, waiters woken and the ms they waited.

The store expires a key's state once it says nothing a fresh key's would not (full,
unpaused) plus an hour; this twin keeps it forever. They differ only where that hour
shows: an adaptive value idle for an hour, and a key whose rate changed while its bucket
was full (a fresh bucket is full under the new rate, a kept one refills towards it).

Choices (the contract's "Choices the Lua twin made", and where it is silent)
--------------------------------------------------------------------------
* **Cost.** A job's cost on a key is ``job_cost(rate, units)`` of the rate *in force*
  (1, or its rate cost ``units``), capped at the key's burst (this twin's proposal: a
  rate whose burst was lowered under a waiting job's cost would otherwise never let
  that head fit, and the key would wait behind it for ever). Takes, fits, due times,
  refunds and tenant charges all use this cost; a correction gives back ``cost -
  used``, made only when ``used >= 0`` differs from it; refunds of offers given back
  always write (a cost of 0 included), as ``correct`` does.
* **Who is settled.** Only a job that named a rate or an adaptive key, or took tokens
  when admitted or woken (the store's ``c:<job>``), is corrected, grown or refunded.
* **Pauses** block any key, with or without a rate (the store's ``pz:<key>``).
* **Dues.** :meth:`RateKeys.lower_due`: a job parks on, or moves to, a key that is
  paused (its end) or whose bucket it does not fit (its ``due_at``); one held back only
  by the key's waiters leaves the due as it is; a waiter leaving a rate key that still
  has waiters makes it due at ``now``. :meth:`RateKeys.set_due`: a wake stops on a
  paused key (the pause's end) or on a head that does not fit (exactly its
  ``due_at``). :meth:`RateKeys.raise_due`: a pushback on a key with waiters, to
  ``until``. Only :meth:`RateKeys.drop_due` removes a due (``fetch`` waking it, at most
  :data:`DUE_BATCH` keys at once, in due order then key order); a due left by a key
  whose waiters have gone wakes nothing.
* **Adaptive values** are clamped into the bounds of the arrival that names them; an
  arrival naming the key with a fixed limit makes it a fixed key again.
"""

from __future__ import annotations

import msgspec

from fairlane.policy.rates import (
    Adaptive,
    Bucket,
    Rate,
    adaptive_cut,
    adaptive_grow,
    correct,
    due_at,
    fits,
    job_cost,
    level,
    take,
)

__all__ = ["DUE_BATCH", "UNLIMITED", "RateCounters", "RateKeys", "key_cost"]

#: The concurrency limit of a key that has none (named only in ``rates``).
UNLIMITED = 2**31 - 1

#: Keys one ``wake_due`` wakes at most (the store's batch per fetch).
DUE_BATCH = 64

#: Jobs one dispatch call of the store parks on their keys at most; a backlog parking
#: on a key is parked over several fetches, each call bounded.
PARK_BUDGET = 256


def key_cost(rate: Rate, units: float) -> float:
    """What a job of rate cost ``units`` takes from ``rate``: 1 or ``units``, at most
    the burst."""
    return min(job_cost(rate, units), rate.capacity)


class RateCounters(msgspec.Struct):
    """A rate key's counters since its state was created."""

    taken: float = 0.0
    refunded: float = 0.0
    debts: float = 0.0
    pushbacks: int = 0
    woken: int = 0
    waited_ms: int = 0


class RateKeys:
    """Buckets, pauses, adaptive values, counters and the due set of rate keys."""

    def __init__(self) -> None:
        self._tokens: dict[str, tuple[float, int]] = {}  # key -> (tokens, stamp)
        self._paused: dict[str, int] = {}
        self._values: dict[str, float] = {}
        self._due: dict[str, int] = {}
        self._counters: dict[str, RateCounters] = {}

    # -- buckets ----------------------------------------------------------------------

    def bucket(self, key: str, rate: Rate, now: int) -> Bucket:
        """``key``'s bucket under ``rate``: as written, or full as of ``now``."""
        written = self._tokens.get(key)
        tokens, stamp = (rate.capacity, now) if written is None else written
        return Bucket(tokens, stamp, self._paused.get(key, 0))

    def stored(self, key: str) -> Bucket | None:
        """The bucket as written (``None`` if its tokens never were: a fresh key's)."""
        written = self._tokens.get(key)
        if written is None:
            return None
        return Bucket(written[0], written[1], self._paused.get(key, 0))

    def paused_until(self, key: str) -> int:
        return self._paused.get(key, 0)

    def fits(self, key: str, rate: Rate, cost: float, now: int) -> bool:
        return fits(rate, self.bucket(key, rate, now), cost, now)

    def due_at(self, key: str, rate: Rate, cost: float, now: int) -> int:
        return due_at(rate, self.bucket(key, rate, now), cost, now)

    def take(self, key: str, rate: Rate, cost: float, now: int) -> None:
        after = take(rate, self.bucket(key, rate, now), cost, now)
        self._tokens[key] = (after.tokens, after.stamp)
        self.counters(key).taken += cost

    def correct(self, key: str, rate: Rate, delta: float, now: int) -> None:
        """A refund (``delta > 0``, capped at the burst) or a debt (``delta < 0``)."""
        before = self.bucket(key, rate, now)
        after = correct(rate, before, delta, now)
        self._tokens[key] = (after.tokens, after.stamp)
        counters = self.counters(key)
        if delta > 0:
            counters.refunded += after.tokens - level(rate, before, now)  # after the cap
        elif delta < 0:
            counters.debts += -delta

    def pause(self, key: str, until: int, now: int) -> bool:
        """Pause ``key`` until ``until`` (a later pause only lengthens it); returns
        whether it was paused already at ``now``."""
        paused = self._paused.get(key, 0)
        self._paused[key] = max(paused, until)
        self.counters(key).pushbacks += 1
        return now < paused

    # -- adaptive values --------------------------------------------------------------

    def value(self, key: str, spec: Adaptive) -> float:
        """An adaptive key's value under ``spec``: as written (else ``max``), clamped."""
        value = self._values.get(key, float(spec.max))
        return min(float(spec.max), max(float(spec.min), value))

    def stored_value(self, key: str) -> float | None:
        return self._values.get(key)

    def cut(self, key: str, spec: Adaptive) -> float:
        value = self._values[key] = adaptive_cut(self.value(key, spec), spec)
        return value

    def grow(self, key: str, spec: Adaptive) -> float:
        value = self._values[key] = adaptive_grow(self.value(key, spec), spec)
        return value

    # -- the due set ------------------------------------------------------------------

    def due(self, key: str) -> int | None:
        return self._due.get(key)

    def set_due(self, key: str, at: int) -> None:
        self._due[key] = at

    def lower_due(self, key: str, at: int) -> None:
        current = self._due.get(key)
        if current is None or at < current:
            self._due[key] = at

    def raise_due(self, key: str, at: int) -> None:
        current = self._due.get(key)
        if current is None or at > current:
            self._due[key] = at

    def next_due(self) -> int | None:
        return min(self._due.values(), default=None)

    def ready(self, now: int) -> list[str]:
        """The keys due at or before ``now``: at most :data:`DUE_BATCH`, in due order, then
        key order (each is taken out with :meth:`drop_due` just before its wake, so a
        due a wake before it wrote for it goes too, as the store's does)."""
        ready = sorted((at, key) for key, at in self._due.items() if at <= now)[:DUE_BATCH]
        return [key for _, key in ready]

    def drop_due(self, key: str) -> None:
        self._due.pop(key, None)

    # -- counters ---------------------------------------------------------------------

    def counters(self, key: str) -> RateCounters:
        got = self._counters.get(key)
        if got is None:
            got = self._counters[key] = RateCounters()
        return got

    def note_wake(self, key: str, waited: int) -> None:
        counters = self.counters(key)
        counters.woken += 1
        counters.waited_ms += max(0, waited)
