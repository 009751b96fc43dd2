"""Tenant limits in a run: each throttled tenant's cap or compressed ceiling, and its slots.

This module owns what the engine needs to throttle tenants as the store does: which
tenants are throttled (a static cap, floor/ceiling settings -- their own key
``tenant:<t>`` in ``fairlane.sim.keys`` -- or shared keys), the signals their
ceiling is computed from (``ceilings.RateWindow`` of submissions, ``DurationMean`` of
slices) and the limit in force at a dispatch (``ceilings.tenant_limit`` on those
signals and the lane's load, under the cap). It records the least and greatest limit
each tenant was held to, overall and per phase, and its peak of slots in use.
"""

from __future__ import annotations

from fairlane.policy.ceilings import F_MAX, F_MIN, DurationMean, RateWindow, tenant_limit
from fairlane.sim.raw import Raw
from fairlane.sim.world import World

__all__ = ["Limits"]


class Limits:
    """The tenants' throttles of one run."""

    def __init__(
        self, world: World, raw: Raw, phases: list[tuple[float, float]], in_use: list[int]
    ) -> None:
        n = world.tenants
        self.w, self.raw, self.phases = world, raw, phases
        self.in_use = in_use  # by key: tenant t's own key is key t
        self.throttled = [bool(keys) for keys in world.keys_of]
        self.rates = {t: RateWindow() for t in range(n) if world.limits[t] is not None}
        self.durs = {t: DurationMean() for t in range(n) if self.throttled[t]}

    def submitted(self, t: int, now: float) -> None:
        """A submission of tenant ``t``: one more in its rate window, if it has settings."""
        if self.rates and t in self.rates:
            self.rates[t].add(int(now * 1000))

    def limit(self, t: int, li: int, now: float, f: list[int], d: list[int]) -> int:
        """The tenant's concurrency limit now: its cap, or its compressed ceiling at the
        lane's load (``f`` in-flight and ``d`` waiting slots per class)."""
        cap, settings = self.w.cap[t], self.w.limits[t]
        if settings is None:
            return cap
        rate = self.rates[t].per_minute(int(now * 1000))
        load = sum(f) + sum(d)
        slots = self.w.lanes[li].slots
        limit = tenant_limit(
            settings, rate, self.durs[t].value(), slots, load, f_min=F_MIN, f_max=F_MAX
        )
        if cap:
            limit = min(limit, cap)
        lo, hi = self.raw.limit_range.get(t, (limit, limit))
        self.raw.limit_range[t] = (min(lo, limit), max(hi, limit))
        for k, (p0, p1) in enumerate(self.phases):
            if p0 <= now < p1:
                ranges = self.raw.limit_phase.setdefault(t, [None] * len(self.phases))
                seen = ranges[k] or (limit, limit)
                ranges[k] = (min(seen[0], limit), max(seen[1], limit))
                break
        return limit

    def peak(self, t: int) -> None:
        """Note the tenant's slots in use, after it took one."""
        peak = self.raw.peak
        if t in self.w.keys_of[t] and self.in_use[t] > peak.get(t, 0):
            peak[t] = self.in_use[t]
