"""The waiting side of the throttles: where a blocked job waits, and how a key's room and
tokens go to its waiters.

The rules (**Blocking**, **Waiter order**, **Wake**, **Due**, **Offers given back**)
and their proofs are ``fairlane.policy.throttle``'s, whose :class:`Throttles` runs its
operations with these steps: find a job's first blocking key and the due it makes
there, put a waiter in its tenant's group, wake a key's waiters least tag first (each
woken one a :class:`Wake`, holding an offer on each of its keys and its tokens), take
and refund tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from fairlane.policy.ratekeys import key_cost
from fairlane.policy.throttlekeys import ThrottleState, Waiter

__all__ = ["ThrottleWaiters", "Wake"]


@dataclass(frozen=True, slots=True)
class Wake:
    """A waiter woken by ``key``: it holds one offer on each of ``keys`` (and its tokens
    on each rate key) and goes back into its tenant's queue of its lane."""

    job_id: str
    keys: tuple[str, ...]
    key: str


class ThrottleWaiters(ThrottleState):
    """The keys' state (``ThrottleState``) with the steps that park and wake their
    waiters (``Throttles``' base)."""

    def _blocker(
        self, keys: tuple[str, ...], units: float, now: int, waking: str | None = None
    ) -> tuple[str, int | None] | None:
        """The first of ``keys`` that blocks a job of rate cost ``units`` at ``now``, and
        the due it makes its key when the job parks there: the pause's end, or when the
        job fits (``None``: blocked by room). ``waking`` is the key
        being woken, whose waiters do not block."""
        for key in keys:
            state = self._keys[key]
            if state.room() <= 0:
                return key, None
            paused = self._rates.paused_until(key)
            if now < paused:
                return key, paused
            rate = state.rate
            if rate is None:
                continue
            cost = key_cost(rate, units)
            # no barging; behind waiters the key is due no later than this job would
            # fit, as a group it forms may be the key's next head
            if (key != waking and state.groups) or not self._rates.fits(key, rate, cost, now):
                return key, self._rates.due_at(key, rate, cost, now)
        return None

    def _enter(self, job_id: str, waiter: Waiter, due: int | None) -> None:
        """Put a waiter in its tenant's group on ``waiter.at``, which is then due no
        later than ``due`` (the blocker's)."""
        self._epoch += 1
        self._keys[waiter.at].join(waiter.tenant, waiter.entry, self._epoch)
        self._parked[job_id] = waiter
        if due is not None:
            self._rates.lower_due(waiter.at, due)

    def _wake_all(self, keys: tuple[str, ...], wakes: list[Wake], now: int) -> None:
        for key in keys:
            state = self._keys[key]
            if state.groups and state.room() > 0:
                self._wake(key, wakes, now)

    def _wake(self, key: str, out: list[Wake], now: int) -> None:
        """Hand ``key``'s room (and tokens) to its waiters, least tag first, until it has
        no room, is paused (then due at the pause's end), nobody waits, or its head does
        not fit (then due when it would)."""
        state = self._keys[key]
        rate = state.rate
        while state.room() > 0:
            paused = self._rates.paused_until(key)
            if now < paused:
                self._rates.set_due(key, paused)
                return
            if not state.groups:
                return
            tenant, job_id = state.head()
            waiter = self._parked[job_id]
            charge = waiter.charge
            if rate is not None:
                charge = key_cost(rate, waiter.units)
                if not self._rates.fits(key, rate, charge, now):
                    self._rates.set_due(key, self._rates.due_at(key, rate, charge, now))
                    return
            del self._parked[job_id]
            state.pop_head(tenant)
            found = self._blocker(waiter.keys, waiter.units, now, waking=key)
            if found is not None:  # found[0] != key: key has room, no pause, its head fits
                if not state.groups[tenant]:
                    state.idle(tenant)
                waiter.at = found[0]
                self._enter(job_id, waiter, found[1])
                self._counts["moves"] += 1
                continue
            for k in waiter.keys:
                self._keys[k].offers += 1
            self._take(job_id, waiter.keys, waiter.units, now)
            self._offered[job_id] = waiter.keys
            state.serve(tenant, charge, self._weights.get(tenant, 1.0))
            if rate is not None:
                self._rates.note_wake(key, now - waiter.since)
            out.append(Wake(job_id, waiter.keys, key))
            self._counts["wakes"] += 1

    def _give_back(
        self, job_id: str, keys: tuple[str, ...], units: float, wakes: list[Wake], now: int
    ) -> None:
        for key in keys:
            self._keys[key].offers -= 1
        self._refund(job_id, keys, units, now)
        self._wake_all(keys, wakes, now)

    def _refund(self, job_id: str, keys: tuple[str, ...], units: float, now: int) -> None:
        if job_id not in self._rated:
            return  # it took nothing: it names no rate or adaptive key and took no tokens
        for key in keys:
            rate = self._keys[key].rate
            if rate is not None:
                self._rates.correct(key, rate, key_cost(rate, units), now)

    def _take(self, job_id: str, keys: tuple[str, ...], units: float, now: int) -> None:
        for key in keys:
            rate = self._keys[key].rate
            if rate is not None:
                self._rates.take(key, rate, key_cost(rate, units), now)
                self._rated.add(job_id)
