"""The engine's raw counters of one run, which ``fairlane.sim.metrics`` summarizes.

Per tenant index unless said otherwise: what was submitted, admitted, started, served
and waited, as the engine accrues it (service and backlogged time clipped to the
measurement window), and the upstreams' calls. The definitions of the reported numbers
are ``fairlane.sim.metrics``'.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fairlane.sim.scenario import Phase
from fairlane.sim.variants import Settings
from fairlane.sim.world import World

if TYPE_CHECKING:
    from fairlane.sim.rates import FairRateKeys

__all__ = ["Raw"]


@dataclass(slots=True)
class Raw:
    """The engine's counters, per tenant index unless said otherwise."""

    settings: Settings
    world: World
    window: tuple[float, float]
    phases: tuple[Phase, ...]
    waits: list[list[float]]
    served: list[float]
    backlog: list[float]
    since: list[float]
    waiting: list[int]
    submitted: list[int]
    completed: list[int]
    rejected: list[int]
    lost: list[int]
    """Rejected with no retries left: never run."""
    handoffs: list[list[int]]
    """Per wait on a throttle key: the key's hand-offs until the job took it (itself too)."""
    resp: list[float]
    """Sum of completion minus first submission over completed jobs."""
    phase_waits: list[list[list[float]]]
    """By report class, then phase."""
    phase_served: list[list[float]]
    done: list[list[float]]
    """Per completed job: completion minus its first submission (recorded in runs with
    rate keys or upstreams)."""
    failed: list[int]
    """Jobs whose attempts ran out (429s retried with backoff)."""
    retried: list[int]
    """Attempts failed by a 429 and retried after backoff."""
    pushed: list[int]
    """Pushbacks taken without spending an attempt."""
    pending: list[int]
    """Jobs calling an upstream that it has not yet served (nor given up on)."""
    pend_since: list[float]
    pend_time: list[float]
    """Time with a job pending on the upstream, clipped to the window."""
    got_calls: list[int]
    got_tokens: list[float]
    """Calls the upstream served in the window, and their tokens, per tenant."""
    up_calls: list[int]
    up_429: list[int]
    up_ok: list[int]
    up_tokens: list[float]
    """Per upstream, calls starting in the window: all, answered 429, served (tokens)."""
    rate_keys: FairRateKeys | None = None
    """The run's rate keys (buckets, ledgers, counters), when it had any."""
    rejections: Counter[str] = field(default_factory=Counter)
    deferrals: Counter[str] = field(default_factory=Counter)
    limit_range: dict[int, tuple[int, int]] = field(default_factory=dict)
    limit_phase: dict[int, list[tuple[int, int] | None]] = field(default_factory=dict)
    """A throttled tenant's least and greatest limit in force, per phase."""
    peak: dict[int, int] = field(default_factory=dict)
    series: list[tuple[float, int, int, int]] = field(default_factory=list)
    """Samples of (time, queued, running, deferred)."""
    yields: int = 0
    parked: int = 0
    max_queued: int = 0
    max_deferred: int = 0
    unfinished: int = 0
    makespan: float = 0.0
    wall: float = 0.0

    @classmethod
    def empty(
        cls,
        settings: Settings,
        world: World,
        window: tuple[float, float],
        phases: tuple[Phase, ...],
    ) -> Raw:
        """Every counter at zero, for ``world``'s tenants and report classes."""
        n, k, u = world.tenants, len(phases), len(world.upstreams)
        return cls(
            settings=settings, world=world, window=window, phases=phases,
            waits=[[] for _ in range(n)], served=[0.0] * n, backlog=[0.0] * n,
            since=[0.0] * n, waiting=[0] * n, submitted=[0] * n, completed=[0] * n,
            rejected=[0] * n, lost=[0] * n, handoffs=[[] for _ in range(n)], resp=[0.0] * n,
            phase_waits=[[[] for _ in range(k)] for _ in world.ckeys],
            phase_served=[[0.0] * k for _ in range(n)] if k else [],
            done=[[] for _ in range(n)], failed=[0] * n, retried=[0] * n, pushed=[0] * n,
            pending=[0] * n, pend_since=[0.0] * n, pend_time=[0.0] * n, got_calls=[0] * n,
            got_tokens=[0.0] * n, up_calls=[0] * u, up_429=[0] * u, up_ok=[0] * u,
            up_tokens=[0.0] * u,
        )  # fmt: skip

    def pend(self, t: int, now: float) -> None:
        """A job of ``t`` waits for its upstream from ``now``."""
        if not self.pending[t]:
            self.pend_since[t] = now
        self.pending[t] += 1

    def unpend(self, t: int, now: float) -> None:
        """A job of ``t`` was served by its upstream, or gave up, at ``now``."""
        if not self.pending[t]:
            return
        self.pending[t] -= 1
        if not self.pending[t]:
            a, b = max(self.pend_since[t], self.window[0]), min(now, self.window[1])
            if b > a:
                self.pend_time[t] += b - a
