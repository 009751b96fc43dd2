"""Arrivals: the jobs a scenario offers, the same for every policy compared.

This module owns turning tenant specs into a time-ordered stream of ``(time, tenant,
size)``. Each ``[[tenants]]`` entry is one *source* with its own generator,
``random.Random(f"{seed}:{index}")``, which draws that source's arrival times, members
and sizes and nothing else -- so the stream depends only on the scenario and its seed,
never on the policy (rejections and their retries are drawn elsewhere). Sources are
generated lazily and merged by ``heapq.merge``; nothing holds all arrivals at once.

* **Poisson** at ``rate`` within ``[start, stop)``; with ``diurnal``, the rate is
  ``rate * (1 + amplitude * sin(2 pi (t - phase) / period))``, drawn by thinning a
  Poisson stream at the peak rate (Lewis and Shedler).
* **Bursts** ``[at, count, over]``: ``count`` jobs at ``at + over * k / count``.
* **Groups** (``count = n``): the members' Poisson streams are drawn as one stream at
  ``n * rate`` whose arrivals pick a member uniformly -- the same process (a
  superposition of independent Poisson streams), at the cost of one stream. Each
  member gets every burst.

Ties in time go to the lower tenant index, then the smaller size (``heapq.merge``'s
tuple order), so the stream is fully deterministic.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator

from fairlane.sim.scenario import Scenario, TenantSpec

__all__ = ["Arrival", "arrivals", "source"]

Arrival = tuple[float, int, float]
"""``(time, tenant index, size in seconds)``."""


def _poisson(spec: TenantSpec, base: int, rng: random.Random, until: float) -> Iterator[Arrival]:
    stop = min(spec.stop, until)
    if spec.rate <= 0 or stop <= spec.start:
        return
    n, size = spec.count, spec.size.sampler(rng)
    diurnal = spec.diurnal
    amp = diurnal.amplitude if diurnal else 0.0
    peak = spec.rate * n * (1.0 + amp)
    uniform, log = rng.random, math.log
    t = spec.start
    # -log(1 - u) / peak is random.expovariate(peak), inlined (the same draws)
    if diurnal is None or amp == 0:
        while True:
            t -= log(1.0 - uniform()) / peak
            if t >= stop:
                return
            yield (t, base + int(uniform() * n) if n > 1 else base, size())
    omega, phase, sin = 2 * math.pi / diurnal.period, diurnal.phase, math.sin
    while True:
        t -= log(1.0 - uniform()) / peak
        if t >= stop:
            return
        if uniform() * (1.0 + amp) <= 1.0 + amp * sin(omega * (t - phase)):
            yield (t, base + int(uniform() * n) if n > 1 else base, size())


def _bursts(spec: TenantSpec, base: int, rng: random.Random, until: float) -> Iterator[Arrival]:
    size = spec.size.sampler(rng)
    times = sorted(
        b.at + b.over * k / b.count for b in spec.bursts for k in range(b.count)
    )  # fmt: skip
    for t in times:
        if t >= until:
            return
        for m in range(spec.count):
            yield (t, base + m, size())


def source(spec: TenantSpec, base: int, seed: int, index: int, until: float) -> Iterator[Arrival]:
    """The arrivals of one ``[[tenants]]`` entry whose first member is tenant ``base``."""
    rng = random.Random(f"{seed}:{index}")
    poisson = _poisson(spec, base, random.Random(f"{seed}:{index}:p"), until)
    if not spec.bursts:
        return poisson
    return heapq.merge(poisson, _bursts(spec, base, rng, until))


def arrivals(scenario: Scenario) -> Iterator[Arrival]:
    """Every arrival of the scenario, in time order."""
    until = scenario.sim.until if scenario.sim.until is not None else math.inf
    streams = []
    base = 0
    for index, spec in enumerate(scenario.tenants):
        streams.append(source(spec, base, scenario.seed, index, until))
        base += spec.count
    return streams[0] if len(streams) == 1 else heapq.merge(*streams)
