"""The engine's view of a scenario under one variant: flat per-tenant and per-lane arrays.

This module owns the mapping from names to integer indices -- tenants (group members
expanded, in declaration order), lanes, *dispatch queues* (one per class of a lane
under ``fair``; one per lane under ``fifo`` or ``classes=off``) and *report classes*
(``lane/class``, or just ``class`` with one lane -- a tenant's declared class, whatever
the policy), *throttle keys* (tenant ``t``'s own key ``tenant:<name>`` is key ``t``; the
scenario's shared keys follow, from index ``tenants``; a shared key's rate and adaptive
limit in force under the variant's ``rate=``), *upstreams* (the services behind keys,
in key order) -- and the layout of a job (``Job``). The engine indexes these lists in
its inner loop instead of dicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fairlane.policy.admission import AdmissionClass, PoolConfig, to_milli
from fairlane.policy.ceilings import TenantLimits
from fairlane.policy.classes import ClassTable
from fairlane.policy.rates import Adaptive, Rate
from fairlane.sim.fastpath import ClassChooser, Gate
from fairlane.sim.scenario import Scenario, SizeDist, UpstreamSpec
from fairlane.sim.variants import Settings, facets

__all__ = ["ANS", "ATT", "FIRST", "OFF", "PARK", "PB", "REJ", "REM", "RUN", "SEQ", "SUB", "TEN",
           "UNLIMITED", "USED", "Job", "LaneWorld", "World", "build"]  # fmt: skip

Job = list[Any]
"""A job: ``[seq, tenant, submitted, remaining, first start, rejections, run, offered,
parked, failed attempts, pushbacks, used, answer]``, by these indices (a list: the
cheapest mutable record in the inner loop); ``offered`` is 1 while a woken job holds an
offer on each of its throttle keys; ``parked`` is ``(key, hand-offs of the key so far)``
from when it first parked until it takes its keys, else None; ``used`` the units it
really uses (drawn at its arrival); ``answer`` the Retry-After (seconds) of the 429 its
current call got, 0.0 while it got none."""
SEQ, TEN, SUB, REM, FIRST, REJ, RUN, OFF, PARK, ATT, PB, USED, ANS = range(13)

UNLIMITED = 2**31 - 1
"""The concurrency limit of a key without one (a rate key only), as in the store."""

_MIN_CHARGE = 1e-3  # a fair-queue cost must be > 0; a zero-unit job is charged a milli-unit


@dataclass(slots=True)
class LaneWorld:
    name: str
    slots: int
    table: ClassTable
    queues: list[int]
    """The lane's dispatch queues, by position (the class table's order under ``fair``)."""
    chooser: ClassChooser | None
    """None when the lane has one dispatch queue that starts whenever a slot is free."""
    uniform: bool
    """Every job of the lane is one slot wide (head widths need no lookup)."""
    gate: Gate | None = None
    pool: PoolConfig | None = None
    specs: list[AdmissionClass] = field(default_factory=list)
    """Admission bounds per class of the table (when there is a gate)."""


@dataclass(slots=True)
class World:
    names: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    group_of: list[int] = field(default_factory=list)
    lane_of: list[int] = field(default_factory=list)
    queue_of: list[int] = field(default_factory=list)
    apos_of: list[int] = field(default_factory=list)
    """Position of the tenant's class in its lane's table (admission counters)."""
    ckey_of: list[int] = field(default_factory=list)
    ckeys: list[str] = field(default_factory=list)
    weight: list[float] = field(default_factory=list)
    width: list[int] = field(default_factory=list)
    mu: list[int] = field(default_factory=list)
    charge: list[float] = field(default_factory=list)
    """The cost of one job under ``charge=units``."""
    retries: list[int] = field(default_factory=list)
    cap: list[int] = field(default_factory=list)
    """Static concurrency cap, 0 for none."""
    limits: list[TenantLimits | None] = field(default_factory=list)
    lanes: list[LaneWorld] = field(default_factory=list)
    queue_lane: list[int] = field(default_factory=list)
    queue_pos: list[int] = field(default_factory=list)
    key_names: list[str] = field(default_factory=list)
    """Throttle keys by index: ``tenant:<name>`` for each tenant, then the shared keys."""
    key_limit: list[int] = field(default_factory=list)
    """A shared key's limit (a tenant key's comes with each dispatch: 0 here)."""
    keys_of: list[tuple[int, ...]] = field(default_factory=list)
    """The keys each of a tenant's jobs takes, in sorted name order (empty: none)."""
    key_rate: list[Rate | None] = field(default_factory=list)
    """A key's rate in force (tenant keys have none)."""
    key_adaptive: list[Adaptive | None] = field(default_factory=list)
    units: list[float] = field(default_factory=list)
    """A job's declared units: its cost on a ``cost="units"`` rate key."""
    used: list[SizeDist | None] = field(default_factory=list)
    """What a job really uses, drawn per job (None: its declared units)."""
    source_of: list[int] = field(default_factory=list)
    """The ``[[tenants]]`` entry a tenant comes from (its draws' generator)."""
    upstreams: list[UpstreamSpec] = field(default_factory=list)
    upstream_names: list[str] = field(default_factory=list)
    """The key each upstream is behind."""
    upstream_of: list[int] = field(default_factory=list)
    """The upstream a tenant's jobs call, -1 for none."""
    upstream_key: list[int] = field(default_factory=list)
    """The key of its upstream a tenant's jobs hold (a 429 is a pushback on it), -1: none."""

    rated: bool = False
    """The keys need the rate rules (``fairlane.sim.rates``): a rate or an adaptive limit
    is in force, or a held key has an upstream (a 429 pauses it)."""

    @property
    def tenants(self) -> int:
        return len(self.names)


def build(scenario: Scenario, settings: Settings) -> World:
    """Index ``scenario`` for ``settings`` (see the module docstring)."""
    w = World()
    lane_index = {lane.name: i for i, lane in enumerate(scenario.lanes)}
    for lane in scenario.lanes:
        by_class = settings.classes
        n = len(lane.table) if by_class else 1
        first = len(w.queue_lane)
        for pos in range(n):
            w.queue_lane.append(len(w.lanes))
            w.queue_pos.append(pos)
        chooser = ClassChooser(lane.table, lane.slots) if by_class else None
        widths = {t.slots for t in scenario.tenants if t.lane == lane.name}
        lw = LaneWorld(lane.name, lane.slots, lane.table, list(range(first, first + n)),
                       chooser, widths <= {1})  # fmt: skip
        if settings.admission and lane.pool is not None:
            lw.gate, lw.pool = Gate(lane.table, lane.pool), lane.pool
            lw.specs = [lane.pool.admission(name) for name in lane.table.names]
        w.lanes.append(lw)
    ckeys: dict[str, int] = {}
    groups: dict[str, int] = {}
    for source, spec in enumerate(scenario.tenants):
        li = lane_index[spec.lane]
        home = w.lanes[li]
        apos = home.table.names.index(spec.service_class)
        queue = home.queues[apos if settings.classes else 0]
        ckey = spec.service_class
        if len(scenario.lanes) > 1:
            ckey = f"{spec.lane}/{spec.service_class}"
        ck = ckeys.setdefault(ckey, len(ckeys))
        g = groups.setdefault(spec.group, len(groups))
        cap = spec.max_concurrency or 0
        for name in spec.names():
            w.names.append(name)
            w.group_of.append(g)
            w.lane_of.append(li)
            w.queue_of.append(queue)
            w.apos_of.append(apos)
            w.ckey_of.append(ck)
            w.weight.append(spec.weight)
            w.width.append(spec.slots)
            w.mu.append(to_milli(spec.units))
            w.charge.append(max(spec.units, _MIN_CHARGE))
            w.retries.append(spec.retries)
            w.cap.append(cap if settings.throttles else 0)
            w.limits.append(spec.limits if settings.throttles else None)
            w.units.append(spec.units)
            w.used.append(spec.used)
            w.source_of.append(source)
    w.ckeys = list(ckeys)
    w.groups = list(groups)
    _keys(w, scenario, settings)
    return w


def _keys(w: World, scenario: Scenario, settings: Settings) -> None:
    n = w.tenants
    w.key_names = [f"tenant:{name}" for name in w.names] + [k.name for k in scenario.keys]
    w.key_limit = [0] * n
    w.key_rate, w.key_adaptive = [None] * n, [None] * n
    in_force: set[str] = set()
    for k in scenario.keys:
        rate, adaptive = facets(k, settings.rate) if settings.throttles else (None, None)
        limit = k.limit if settings.throttles else None
        if adaptive is not None:
            limit = adaptive.max
        elif limit is None and rate is not None:
            limit = UNLIMITED
        if limit is not None:
            in_force.add(k.name)
        w.key_limit.append(limit or 0)
        w.key_rate.append(rate)
        w.key_adaptive.append(adaptive)
    shared = {k.name: n + i for i, k in enumerate(scenario.keys)}
    ups = {k.name: i for i, k in enumerate(k for k in scenario.keys if k.upstream is not None)}
    w.upstreams = [k.upstream for k in scenario.keys if k.upstream is not None]
    w.upstream_names = list(ups)
    w.keys_of = []
    t = 0
    for spec in scenario.tenants:
        named = [shared[name] for name in spec.keys if name in in_force]
        calls = next((name for name in spec.keys if name in ups), None)
        for _ in range(spec.count):
            mine = list(named)
            if w.cap[t] or w.limits[t] is not None:
                mine.append(t)
            w.keys_of.append(tuple(sorted(mine, key=w.key_names.__getitem__)))
            w.upstream_of.append(-1 if calls is None else ups[calls])
            w.upstream_key.append(shared[calls] if calls in in_force else -1)
            t += 1
    w.rated = any(r is not None for r in w.key_rate) or any(a is not None for a in w.key_adaptive)
    w.rated = w.rated or any(k >= 0 for k in w.upstream_key)
