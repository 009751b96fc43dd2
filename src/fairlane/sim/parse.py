"""Reading a scenario from TOML: every error names the file and the key path.

This module owns the scenario file format. Lane class tables and admission pools are
read by the project's own parsers -- ``[[lanes.<lane>.classes]]`` by
``fairlane.config.lanes.parse_lanes``, ``[pools.<lane>]`` (seed 002's layout, with
``[estimation]`` and ``[retry]``) by ``fairlane.config.pools.parse_config`` -- so a scenario's
lanes are declared exactly as a deployment's are. Layout::

    name = "noisy-neighbor"          # default: the file's stem
    description = "..."
    seed = 1

    [sim]
    slice = inf                      # seconds; a longer job yields and re-enters
    charge = "time"                  # or "jobs", "units" (what a dispatch charges)
    until = 600                      # optional: stop the clock here
    window = [0, 300]                # optional: where shares and utilisation count
    sample = 1.0                     # optional: seconds between queue samples

    [compare]
    variants = ["fair", "fifo"]      # see fairlane.sim.variants

    [lanes.default]
    slots = 16                       # worker slots (the lane's capacity C)
    # classes: [[lanes.default.classes]] as in fairlane.config.lanes, or a [pools.default]
    # table (classes and admission together); neither: guaranteed/standard/batch

    [[tenants]]
    name = "t{i:04d}"                # a pattern when count > 1
    count = 100                      # default 1
    group = "small"                  # the row in reports; default: the name
    lane = "default"                 # optional with one lane
    class = "standard"               # default "standard"
    weight = 1.0
    rate = 2.0                       # Poisson arrivals per second
    diurnal = { amplitude = 0.5, period = 600, phase = 0 }   # modulates rate
    bursts = [[10, 500, 5]]          # [at, count, over]: count jobs over `over` s
    size = { dist = "lognormal", mean = 0.2, sigma = 1.0 }   # or a number (fixed)
    start = 0                        # arrivals only within [start, stop)
    stop = 300
    max_concurrency = 4              # a static cap (throttle key tenant:<name>)
    limits = { floor = 1, burst_pct = 0.5, burst_floor = 0, max_concurrency = 20 }
    slots = 1                        # width of each job in worker slots
    units = 1.0                      # units reserved at the admission gate
    retries = 0                      # resubmissions after a rejection
    keys = ["model:big"]             # shared throttle keys its jobs take (see [[keys]])
    used = { dist = "lognormal", mean = 900, sigma = 0.5 }   # or a number: the units a
                                     # job really uses (default: its `units`, exactly)

    [[keys]]                         # a shared throttle key, taken by the tenants naming it
    name = "model:big"
    limit = 4                        # at most this many of its jobs run at once
    # or, instead of limit, an adaptive concurrency limit (fairlane.policy.rates.Adaptive):
    adaptive = { max = 40, min = 1 }
    # a rate key (fairlane.policy.rates.Rate): at most `limit` per `per` seconds,
    # bursting to `burst` (default limit), counting jobs or the jobs' declared units
    rate = { limit = 90000, per = 60, burst = 10000, cost = "units" }
    # the upstream its jobs call (a model provider): token buckets of calls and tokens
    upstream = { rps = 20, rps_burst = 20, tpm = 60000, tpm_burst = 5000,
                 retry_step = 1.0, reject_time = 0.01 }

A key needs ``limit``, ``adaptive`` or ``rate`` (any with ``rate``; ``limit`` and
``adaptive`` exclude each other). A rate counting ``units`` takes a job's declared
``units`` (its tenant's, as the gate reserves them) and, when the attempt ends,
corrects the bucket by ``units - used`` (a refund, or a debt); a tenant whose
``units`` exceed the burst of such a key is refused (it could never fit). A key's
``upstream`` (``rps`` calls per second and/or ``tpm`` tokens per minute, each with an
optional ``*_burst``, default one period's worth) answers each call at its start: it
fits both buckets (taking one call and its ``used`` tokens, a draw capped at
``tpm_burst``), or it is a 429 after ``reject_time`` seconds with a Retry-After of the
time until it would fit, rounded up to ``retry_step`` seconds. A 429 on a key the job
holds is a pushback (``fairlane.sim.rates``: the key is paused until the Retry-After,
the job is due again then without spending an attempt, up to ``MAX_PUSHBACKS``); on a
key it does not hold (``rate=none``, no ``limit``) an ordinary failure, retried with
``[retry]``'s backoff while ``max_attempts`` lasts. A tenant names at most one key with
an upstream; a call to an upstream is never sliced.

    [[phases]]
    name = "overload"
    start = 60
    end = 180

Sizes: ``fixed`` (``mean``), ``exponential`` (``mean``), ``lognormal`` (``mean``,
``sigma``), ``pareto`` (``mean``, ``alpha`` > 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from fairlane.config.lanes import DEFAULT_CLASS, check_lane, parse_lanes, read_toml
from fairlane.config.pools import parse_config
from fairlane.policy.ceilings import TenantLimits
from fairlane.policy.classes import ClassTable
from fairlane.sim.fastpath import ClassChooser
from fairlane.sim.parsekeys import parse_keys, tenant_keys
from fairlane.sim.scenario import (
    Burst,
    Charge,
    Diurnal,
    KeySpec,
    LaneSpec,
    Phase,
    Scenario,
    SimSettings,
    SizeDist,
    SizeKind,
    TenantSpec,
)
from fairlane.sim.tables import Table
from fairlane.sim.variants import parse_variant

__all__ = ["load_scenario", "parse_scenario"]

_TOP = ("name", "description", "seed", "sim", "compare", "lanes", "pools", "retry",
        "estimation", "keys", "tenants", "phases")  # fmt: skip
_SIM = ("slice", "charge", "until", "window", "sample")
_TENANT = ("name", "count", "group", "lane", "class", "weight", "rate", "diurnal", "bursts",
           "size", "start", "stop", "max_concurrency", "limits", "slots", "units",
           "retries", "keys", "used")  # fmt: skip
_SIZE = ("dist", "mean", "sigma", "alpha")
_DISTS = ("fixed", "exponential", "lognormal", "pareto")
_LIMITS = ("floor", "max_concurrency", "burst_floor", "burst_pct")
_MAX_TENANTS = 1_000_000


def load_scenario(path: Path | str) -> Scenario:
    """Read a scenario file; ``ConfigError`` naming the file and key if it is invalid."""
    path = Path(path)
    return parse_scenario(read_toml(path, "scenario"), source=str(path), default_name=path.stem)


def parse_scenario(
    data: Mapping[str, Any], *, source: str = "scenario", default_name: str = "scenario"
) -> Scenario:
    """A scenario from parsed TOML (or an equivalent mapping)."""
    top = Table(data, "", source, _TOP)
    lanes, declared = _lanes(top)
    config = parse_config(
        {k: top.data[k] for k in ("pools", "retry", "estimation") if k in top.data},
        source=source,
    )
    for name, pool in config.pools.items():
        if name not in lanes:
            raise top.error(f"pools.{name}", f"no lane {name!r} under [lanes] for this pool")
        if name in declared:
            raise top.error(
                f"pools.{name}", "the lane declares classes twice: [pools] and [[lanes.classes]]"
            )
        lanes[name] = LaneSpec(name, lanes[name].slots, pool.table, pool.admission)
    keys = parse_keys(top)
    tenants = [
        _tenant(Table(body, f"tenants[{i}]", source, _TENANT), lanes, keys)
        for i, body in enumerate(top.array("tenants"))
    ]
    if not tenants:
        raise top.error("tenants", "needs at least one [[tenants]] entry")
    if sum(t.count for t in tenants) > _MAX_TENANTS:
        raise top.error("tenants", f"at most {_MAX_TENANTS} tenants in all")
    seen: set[str] = set()
    for i, spec in enumerate(tenants):
        for name in spec.names():
            if name in seen:
                raise top.error(f"tenants[{i}].name", f"tenant {name!r} is named twice")
            seen.add(name)
    sim = _sim(Table(top.data.get("sim", {}), "sim", source, _SIM))
    for i, spec in enumerate(tenants):
        if spec.rate > 0 and math.isinf(spec.stop) and sim.until is None:
            raise top.error(
                f"tenants[{i}].stop", "a tenant with a rate needs a stop (or set [sim] until)"
            )
    homes: dict[str, tuple[str, str]] = {}
    for i, spec in enumerate(tenants):
        home = homes.setdefault(spec.group, (spec.lane, spec.service_class))
        if home != (spec.lane, spec.service_class):
            raise top.error(
                f"tenants[{i}].group",
                f"group {spec.group!r} is already in lane {home[0]!r}, class {home[1]!r}; "
                "a group's tenants share one lane and class",
            )
    compare = _compare(top)
    return Scenario(
        name=top.string("name", default_name),
        description=str(top.data.get("description", "")),
        source=source,
        seed=top.integer("seed", 0, high=2**63 - 1),
        sim=sim,
        lanes=tuple(lanes.values()),
        tenants=tuple(tenants),
        phases=_phases(top),
        keys=tuple(keys.values()),
        compare=compare,
        estimation=config.estimation,
        retry=config.retry,
    )


def _lanes(top: Table) -> tuple[dict[str, LaneSpec], set[str]]:
    raw = top.data.get("lanes")
    if not isinstance(raw, Mapping) or not raw:
        raise top.error("lanes", "needs at least one lane: [lanes.<name>] with slots = N")
    lanes: dict[str, LaneSpec] = {}
    declared: set[str] = set()
    for name, body in raw.items():
        lane = Table(body, f"lanes.{name}", top.source, ("slots", "classes"))
        try:
            check_lane(name)
        except ValueError as exc:
            raise lane.error("", str(exc)) from None
        if "slots" not in lane.data:
            raise lane.error("slots", "is required (the lane's worker slots)")
        slots = lane.integer("slots", 0, low=1, high=1_000_000)
        table = ClassTable()
        if "classes" in lane.data:
            declared.add(name)
            table = parse_lanes({"lanes": {name: {"classes": lane.data["classes"]}}},
                                source=top.source)[name]  # fmt: skip
        lanes[name] = LaneSpec(name, slots, table)
    return lanes, declared


def _sim(sim: Table) -> SimSettings:
    charge = sim.data.get("charge", "time")
    if charge not in ("time", "jobs", "units"):
        raise sim.error("charge", f"must be one of time, jobs, units, got {charge!r}")
    window = None
    if "window" in sim.data:
        pair = sim.data["window"]
        ok = isinstance(pair, list) and len(pair) == 2
        ok = ok and all(isinstance(x, int | float) and not isinstance(x, bool) for x in pair)
        if not ok or not 0 <= pair[0] < pair[1] < math.inf:
            raise sim.error("window", f"must be [start, end] with 0 <= start < end, got {pair!r}")
        window = (float(pair[0]), float(pair[1]))
    return SimSettings(
        slice=sim.number("slice", math.inf, positive=True, infinite=True),
        charge=cast(Charge, charge),
        until=sim.number("until", 0, positive=True) if "until" in sim.data else None,
        window=window,
        sample=sim.number("sample", 0, positive=True) if "sample" in sim.data else None,
    )


def _compare(top: Table) -> tuple[str, ...]:
    table = Table(top.data.get("compare", {}), "compare", top.source, ("variants",))
    if "variants" not in table.data:
        return ("fair", "fifo")
    texts = table.array("variants")
    if not texts:
        raise table.error("variants", "must list at least one variant")
    for i, text in enumerate(texts):
        try:
            if not isinstance(text, str):
                raise ValueError(f"must be a string, got {text!r}")
            parse_variant(text)
        except ValueError as exc:
            raise table.error(f"variants[{i}]", str(exc)) from None
    if len(set(texts)) != len(texts):
        raise table.error("variants", f"variants must differ: {texts}")
    return tuple(texts)


def _phases(top: Table) -> tuple[Phase, ...]:
    phases = []
    for i, body in enumerate(top.array("phases")):
        p = Table(body, f"phases[{i}]", top.source, ("name", "start", "end"))
        start, end = p.number("start", 0.0), p.number("end", math.inf, infinite=True)
        if end <= start:
            raise p.error("end", f"must be after start ({start:g}), got {end:g}")
        phases.append(Phase(p.string("name"), start, end))
    return tuple(phases)


def _size(t: Table, name: str = "size") -> SizeDist:
    raw = t.data.get(name, 1.0)
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return SizeDist("fixed", t.number(name, 1.0, positive=True))
    s = Table(raw, t.at(name), t.source, _SIZE)
    kind = s.data.get("dist", "fixed")
    if kind not in _DISTS:
        raise s.error("dist", f"must be one of {', '.join(_DISTS)}, got {kind!r}")
    if "mean" not in s.data:
        raise s.error("mean", "is required" + (" (seconds)" if name == "size" else ""))
    sigma = s.number("sigma", 1.0) if kind == "lognormal" else 0.0
    alpha = s.number("alpha", 2.0, positive=True) if kind == "pareto" else 0.0
    if kind == "pareto" and alpha <= 1:
        raise s.error("alpha", f"must be > 1 (else the mean is infinite), got {alpha!r}")
    for key, owner in (("sigma", "lognormal"), ("alpha", "pareto")):
        if key in s.data and kind != owner:
            raise s.error(key, f"does not apply to dist = {kind!r}")
    return SizeDist(cast(SizeKind, kind), s.number("mean", 1.0, positive=True), sigma, alpha)


def _bursts(t: Table) -> tuple[Burst, ...]:
    bursts = []
    for i, item in enumerate(t.array("bursts")):
        ok = isinstance(item, list) and len(item) in (2, 3)
        ok = ok and all(isinstance(x, int | float) and not isinstance(x, bool) for x in item)
        if ok:
            at, count, over = item[0], item[1], item[2] if len(item) == 3 else 0
            ok = isinstance(count, int) and count >= 0 and 0 <= at < math.inf
            ok = ok and 0 <= over < math.inf
        if not ok:
            raise t.error(
                f"bursts[{i}]", f"must be [at, count, over] (count an integer), got {item!r}"
            )
        bursts.append(Burst(float(at), int(count), float(over)))
    return tuple(bursts)


def _limits(t: Table) -> TenantLimits | None:
    if "limits" not in t.data:
        return None
    lim = Table(t.data["limits"], t.at("limits"), t.source, _LIMITS)
    cap = lim.integer("max_concurrency", 1, low=1) if "max_concurrency" in lim.data else None
    try:
        return TenantLimits(
            floor=lim.integer("floor", 1),
            max_concurrency=cap,
            burst_floor=lim.integer("burst_floor", 0),
            burst_pct=lim.number("burst_pct", 0.0),
        )
    except ValueError as exc:
        raise lim.error("", str(exc)) from None


def _place(t: Table, lanes: dict[str, LaneSpec]) -> tuple[str, str, int]:
    """A tenant's lane, class and job width, checked against the lane's table."""
    if "lane" in t.data or len(lanes) > 1:
        lane_name = t.string("lane")
        if lane_name not in lanes:
            raise t.error("lane", f"no lane {lane_name!r} (lanes: {', '.join(lanes)})")
    else:
        lane_name = next(iter(lanes))
    lane = lanes[lane_name]
    cls = t.string("class", DEFAULT_CLASS)
    if cls not in lane.table:
        raise t.error(
            "class",
            f"lane {lane_name!r} has no class {cls!r} (classes: {', '.join(lane.table.names)})",
        )
    slots = t.integer("slots", 1, low=1)
    widest = ClassChooser(lane.table, lane.slots).widest[lane.table.names.index(cls)]
    if slots > widest:
        raise t.error(
            "slots", f"{slots} is wider than class {cls!r} can ever start in lane "
            f"{lane_name!r} ({widest} of {lane.slots} slots)",
        )  # fmt: skip
    return lane_name, cls, slots


def _diurnal(t: Table) -> Diurnal | None:
    if "diurnal" not in t.data:
        return None
    d = Table(t.data["diurnal"], t.at("diurnal"), t.source, ("amplitude", "period", "phase"))
    amplitude = d.number("amplitude", 0.5)
    if amplitude > 1:
        raise d.error("amplitude", f"must be within [0, 1], got {amplitude!r}")
    return Diurnal(amplitude, d.number("period", 86400.0, positive=True),
                   d.number("phase", 0.0))  # fmt: skip


def _tenant(t: Table, lanes: dict[str, LaneSpec], keys: dict[str, KeySpec]) -> TenantSpec:
    count = t.integer("count", 1, low=1, high=_MAX_TENANTS)
    name = t.string("name")
    if count > 1:
        try:
            names = {name.format(i=0), name.format(i=count - 1)}
        except (KeyError, IndexError, ValueError) as exc:
            raise t.error("name", f"is not a valid pattern with {{i}}: {exc}") from None
        if len(names) < 2:
            raise t.error("name", f"count = {count} needs a pattern such as 't{{i:05d}}'")
    lane_name, cls, slots = _place(t, lanes)
    start = t.number("start", 0.0)
    stop = t.number("stop", math.inf, infinite=True)
    if stop < start:
        raise t.error("stop", f"must not be before start ({start:g}), got {stop:g}")
    diurnal = _diurnal(t)
    rate = t.number("rate", 0.0)
    if diurnal and not rate:
        raise t.error("diurnal", "modulates `rate`; give the tenant a rate > 0")
    cap = t.integer("max_concurrency", 1, low=1) if "max_concurrency" in t.data else None
    return TenantSpec(
        name=name,
        group=t.string("group", name),
        lane=lane_name,
        service_class=cls,
        count=count,
        weight=t.number("weight", 1.0, positive=True),
        rate=rate,
        diurnal=diurnal,
        bursts=_bursts(t),
        size=_size(t),
        start=start,
        stop=stop,
        max_concurrency=cap,
        limits=_limits(t),
        slots=slots,
        units=t.number("units", 1.0),
        retries=t.integer("retries", 0, high=1000),
        keys=tenant_keys(t, keys),
        used=_size(t, "used") if "used" in t.data else None,
    )
