"""The demo's workload: who submits what, when, and how long each job waits on its calls.

This module owns the arrivals of one run, drawn from a seed so that the fair run and the
FIFO run see exactly the same jobs at exactly the same offsets. It is pure: no I/O, no
clock. Each tenant draws from its own generator (seeded by the seed and its name), so
adding tenants leaves the others' arrivals unchanged.

The tenants of a run of ``window`` seconds of arrivals (the run's first 70 %):

* ``flood``: two bursts of agent steps (lane ``light``, class ``standard``), about
  ``10 x window`` jobs each, at 8 % and 50 % of the window, and a burst of document
  renders in lane ``heavy``. It honours Retry-After: a rejected job is submitted again
  after the time it was told, at most twice, while the window lasts.
* ``steady-1`` .. ``steady-N``: agent steps, Poisson arrivals of one a second each.
* ``interactive``: short chat replies in class ``guaranteed``, two a second.
* ``batch``: long summaries in class ``batch`` (spare capacity only), and once a job too
  wide for the pool (rejected ``too_wide`` when admission is on).
* ``research``: two long workflow runs in lane ``heavy`` that yield between slices.

Durations are lognormal (a median and a spread), as model and tool latencies are: most
calls are quick and a few are many times slower. About 5 % of jobs fail their first
attempt, and their retry succeeds.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "RUN_SHARE_OF_ARRIVALS",
    "Arrival",
    "Kind",
    "Workload",
    "build_workload",
    "tenant_names",
]

Kind = Literal["agent", "chat", "summarise", "render", "research"]

#: arrivals take this part of a run; the rest lets the queues drain
RUN_SHARE_OF_ARRIVALS = 0.7
_FAIL_FIRST = 0.05
_MAX_CALL = 6.0  # seconds: the tail is long, not unbounded
_FLOOD_PER_SECOND = 10.0  # jobs per burst, per second of window
_STEADY_RATE = 1.0  # jobs/s per steady tenant
_CHAT_RATE = 2.0
_BATCH_RATE = 0.6
_RENDERS_PER_SECOND = 2.0
_RESEARCH_RUNS = 2


@dataclass(frozen=True, slots=True)
class Arrival:
    """One job as its tenant submits it (``at`` seconds into the run)."""

    at: float
    tenant: str
    kind: Kind
    lane: str
    service_class: str
    waits: tuple[float, ...]
    """The simulated model and tool calls, in seconds, one after another."""
    fail_first: bool
    input_tokens: int
    output_tokens: int

    @property
    def work(self) -> float:
        """Seconds of a worker slot the job holds (its calls, end to end)."""
        return sum(self.waits)


@dataclass(frozen=True, slots=True)
class Workload:
    """All arrivals of one run, in time order."""

    seconds: float
    """How long the run lasts (arrivals, then draining)."""
    window: float
    """Arrivals happen within the first ``window`` seconds."""
    seed: int
    tenants: tuple[str, ...]
    """Every tenant, in display order."""
    arrivals: tuple[Arrival, ...]


def tenant_names(steady: int) -> tuple[str, ...]:
    """The tenants of a run with ``steady`` steady tenants, in display order."""
    return (
        "flood",
        *(f"steady-{i}" for i in range(1, steady + 1)),
        "interactive",
        "batch",
        "research",
    )


def _call(rng: random.Random, median: float, spread: float) -> float:
    """A lognormal call latency (seconds) with this median, rounded to the millisecond."""
    return round(min(_MAX_CALL, rng.lognormvariate(math.log(median), spread)), 3)


def _poisson(rng: random.Random, rate: float, start: float, end: float) -> list[float]:
    """Arrival times of a Poisson process of ``rate`` per second within [start, end); at
    least one, so that every tenant takes part even in a very short run."""
    times: list[float] = []
    t = start + rng.expovariate(rate)
    while t < end:
        times.append(round(t, 3))
        t += rng.expovariate(rate)
    return times or [round(rng.uniform(start, end), 3)]


#: a token count: fixed, or drawn uniformly from (low, high)
_Tokens = int | tuple[int, int]


def _tokens(rng: random.Random, tokens: _Tokens) -> int:
    return tokens if isinstance(tokens, int) else rng.randint(*tokens)


def _arrival(  # noqa: PLR0917 - an arrival's own fields
    rng: random.Random,
    at: float,
    who: tuple[str, Kind, str, str],
    waits: tuple[float, ...],
    tokens: tuple[_Tokens, _Tokens],
    fails: bool = True,
) -> Arrival:
    """An arrival of ``who`` (tenant, kind, lane, class); drawn in a fixed order (its
    first attempt's failure, then its tokens) so that a seed gives the same jobs."""
    tenant, kind, lane, service_class = who
    return Arrival(
        at=at,
        tenant=tenant,
        kind=kind,
        lane=lane,
        service_class=service_class,
        waits=waits,
        fail_first=fails and rng.random() < _FAIL_FIRST,
        input_tokens=_tokens(rng, tokens[0]),
        output_tokens=_tokens(rng, tokens[1]),
    )


def _agent(rng: random.Random, at: float, tenant: str) -> Arrival:
    """An agent step: a model call, often a tool call, sometimes a second model call."""
    waits = [_call(rng, 0.22, 0.7)]
    if rng.random() < 0.6:
        waits.append(_call(rng, 0.12, 0.8))
        if rng.random() < 0.5:
            waits.append(_call(rng, 0.18, 0.6))
    who: tuple[str, Kind, str, str] = (tenant, "agent", "light", "standard")
    return _arrival(rng, at, who, tuple(waits), ((1_000, 4_000), (200, 800)))


def _chat(rng: random.Random, at: float) -> Arrival:
    waits = (_call(rng, 0.08, 0.5),)
    return _arrival(
        rng, at, ("interactive", "chat", "light", "guaranteed"), waits, ((300, 800), (100, 300))
    )


def _summary(rng: random.Random, at: float, *, too_wide: bool = False) -> Arrival:
    waits = (_call(rng, 0.9, 0.5),)
    # a whole corpus at once: wider than the pool's max_reservation_units
    inputs: _Tokens = 60_000 if too_wide else (8_000, 16_000)
    return _arrival(
        rng, at, ("batch", "summarise", "light", "batch"), waits, (inputs, (500, 1_500))
    )


def _render(rng: random.Random, at: float) -> Arrival:
    waits = (_call(rng, 0.5, 0.6),)
    return _arrival(rng, at, ("flood", "render", "heavy", "standard"), waits, ((500, 2_000), 0))


def _research(rng: random.Random, at: float, steps: int) -> Arrival:
    waits = tuple(_call(rng, 0.2, 0.6) for _ in range(steps))
    return _arrival(rng, at, ("research", "research", "heavy", "standard"), waits, (0, 0), False)


def _flood(seed: int, window: float) -> list[Arrival]:
    rng = random.Random(f"{seed}:flood")
    burst = max(10, round(_FLOOD_PER_SECOND * window))
    out: list[Arrival] = []
    for start in (0.08 * window, 0.5 * window):
        # a client pushing a batch as fast as it can: a few jobs per millisecond
        out.extend(_agent(rng, round(start + i * 0.0005, 4), "flood") for i in range(burst))
    renders = max(4, round(_RENDERS_PER_SECOND * window))
    out.extend(_render(rng, round(0.1 * window + i * 0.0005, 4)) for i in range(renders))
    return out


def build_workload(seconds: float, steady: int, seed: int) -> Workload:
    """The arrivals of one run of ``seconds`` with ``steady`` steady tenants."""
    if seconds <= 0:
        raise ValueError(f"a run lasts > 0 seconds, got {seconds}")
    if steady < 0:
        raise ValueError(f"the number of steady tenants is >= 0, got {steady}")
    window = seconds * RUN_SHARE_OF_ARRIVALS
    arrivals = _flood(seed, window)
    for i in range(1, steady + 1):
        name = f"steady-{i}"
        rng = random.Random(f"{seed}:{name}")
        arrivals.extend(_agent(rng, t, name) for t in _poisson(rng, _STEADY_RATE, 0.0, window))
    rng = random.Random(f"{seed}:interactive")
    arrivals.extend(_chat(rng, t) for t in _poisson(rng, _CHAT_RATE, 0.0, window))
    rng = random.Random(f"{seed}:batch")
    arrivals.extend(_summary(rng, t) for t in _poisson(rng, _BATCH_RATE, 0.0, window))
    arrivals.append(_summary(rng, round(0.3 * window, 3), too_wide=True))
    rng = random.Random(f"{seed}:research")
    steps = max(6, round(window) + 4)
    for k in range(_RESEARCH_RUNS):
        arrivals.append(_research(rng, round((0.12 + 0.33 * k) * window, 3), steps))
    arrivals.sort(key=lambda a: a.at)
    return Workload(
        seconds=seconds,
        window=window,
        seed=seed,
        tenants=tenant_names(steady),
        arrivals=tuple(arrivals),
    )
