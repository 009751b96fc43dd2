"""What a run measured: the summaries made from the engine's raw counters (``Raw``, in
``fairlane.sim.raw``).

This module owns the definitions of every reported number:

* **Start delay** (wait): first start minus the submission the gate took (the
  arrival, or the resubmission that was accepted or deferred); p50 and p99 are
  nearest-rank percentiles, max the largest. Per tenant, per group (the ``group`` of
  a ``[[tenants]]`` entry), per report class, and per class and phase (by the phase
  the job *arrived* in).
* **Measurement window** ``[w0, w1]``: ``[sim] window``, else ``[0, end of arrivals]``
  (``[0, end of run]`` when every arrival is at 0). Service is slot-seconds of
  slices clipped to it; **utilisation** is a lane's service over ``slots * (w1 -
  w0)``.
* **Backlogged**: a tenant with admitted work waiting to start for at least
  ``BACKLOGGED`` (95 %) of the window. Only backlogged tenants are owed a share:
  within a class, tenant ``i``'s **share** is its service over the class's backlogged
  service, its **fair share** ``w_i / sum(w)`` over the class's backlogged tenants.
* **Jain's fairness index** of a class: ``(sum x)^2 / (n sum x^2)`` over ``x_i =
  service_i / w_i`` of its backlogged tenants (1 is perfectly weighted; ``1/n`` is one
  tenant taking everything); None with fewer than two. A run's index is its lowest.
* **Hand-offs** (throttle keys): a job that parked on a key, counted in the key's
  hand-offs (each time a job takes a slot on it) from when it parked until it took
  its keys, itself included: 1 is the very next slot the key gave. p50/p99 per row.
* **Completion** (done): completion minus first submission, of completed jobs, in runs
  with rate keys or upstreams; p99 per row and per upstream.
* **Upstreams** (a key's ``upstream``), over the calls starting in the window:
  **capacity** its sustained calls and tokens per second; **goodput** what it served
  per second, and against capacity the larger of the two ratios (the binding limit);
  **429 share** 429s over calls. A tenant is **backlogged on the upstream** with a job
  it has not yet served (queued, parked on a key, backing off or pushed back) for
  ``BACKLOGGED`` of the window; its **share** is its part of the upstream's goodput
  (tokens if the upstream counts tokens, else calls) among those tenants, against
  ``w_i / sum(w)``, and the upstream's **Jain** index is over their goodput per weight.
  Failed jobs: attempts spent on 429s without a pushback.
* **Phase shares**: each group's fraction of its class's service within each phase;
  **limits** (throttled tenants): the least and greatest concurrency limit in force
  at its dispatches, overall and per phase.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from fairlane.sim.raw import Raw
from fairlane.sim.variants import Settings

__all__ = [
    "BACKLOGGED",
    "ClassRow",
    "Raw",
    "Row",
    "UpstreamRow",
    "VariantResult",
    "Waits",
    "jain",
    "percentile",
    "summarize",
]

BACKLOGGED = 0.95


@dataclass(frozen=True, slots=True)
class Waits:
    jobs: int
    p50: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Waits:
        xs = sorted(values)
        return cls(len(xs), percentile(xs, 0.5), percentile(xs, 0.99), xs[-1] if xs else math.nan)


@dataclass(frozen=True, slots=True)
class Row:
    """A tenant, or a group of tenants."""

    name: str
    service_class: str
    tenants: int
    weight: float
    submitted: int
    completed: int
    rejected: int
    lost: int
    waits: Waits
    mean_response: float
    backlogged: int
    share: float | None
    fair_share: float | None
    limit: tuple[int, int] | None = None
    peak: int | None = None
    phase_shares: tuple[float | None, ...] = ()
    phase_limits: tuple[tuple[int, int] | None, ...] = ()
    handoffs: Waits | None = None
    """Its jobs' waits on a throttle key counted in the key's hand-offs (None: none waited)."""
    done: Waits | None = None
    """Completion minus submission of its completed jobs (None: none completed, or a run
    without rate keys and upstreams, which does not record them)."""
    failed: int = 0
    up_share: float | None = None
    """Its share of its upstream's goodput, when backlogged on it."""
    up_fair: float | None = None


@dataclass(frozen=True, slots=True)
class UpstreamRow:
    """One upstream (the key it is behind) in one run."""

    key: str
    rate: str
    """The key's facets in force: its rate and adaptive limit, or ``-``."""
    capacity_calls: float | None
    capacity_tokens: float | None
    calls: int
    throttled: int
    share_429: float | None
    goodput_calls: float
    goodput_tokens: float
    goodput: float | None
    """Goodput over capacity, the binding one of calls and tokens."""
    jain: float | None
    backlogged: int
    done: Waits
    failed: int
    pushbacks: int
    retried: int
    limits: tuple[int, int] | None
    """An adaptive key's least limit in force and its limit at the end."""
    refunded: float
    debt: float


@dataclass(frozen=True, slots=True)
class ClassRow:
    name: str
    waits: Waits
    backlogged: int
    jain: float | None
    phase_p99: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class VariantResult:
    settings: Settings
    submitted: int
    completed: int
    rejections: dict[str, int]
    deferrals: dict[str, int]
    lost: int
    unfinished: int
    yields: int
    parked: int
    max_queue: int
    max_deferred: int
    utilisation: dict[str, float]
    makespan: float
    window: tuple[float, float]
    wall: float
    jain: float | None
    classes: tuple[ClassRow, ...]
    groups: tuple[Row, ...]
    tenants: tuple[Row, ...]
    phases: tuple[str, ...]
    series: tuple[tuple[float, int, int, int], ...]
    failed: int = 0
    upstreams: tuple[UpstreamRow, ...] = ()

    @property
    def label(self) -> str:
        return self.settings.label

    @property
    def rejected(self) -> int:
        return sum(self.rejections.values())


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of already sorted values (nan if empty)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p * len(sorted_values)))
    return sorted_values[rank - 1]


def jain(xs: list[float]) -> float | None:
    """Jain's fairness index of ``xs``; None for fewer than two values or all zero."""
    square = sum(x * x for x in xs)
    if len(xs) < 2 or square == 0:
        return None
    return sum(xs) ** 2 / (len(xs) * square)


def _span(ranges: list[tuple[int, int] | None]) -> tuple[int, int] | None:
    known = [r for r in ranges if r is not None]
    return (min(lo for lo, _ in known), max(hi for _, hi in known)) if known else None


def summarize(raw: Raw) -> VariantResult:
    """The reported numbers of one run (see the module docstring)."""
    w = raw.world
    w0, w1 = raw.window
    end = w1 if math.isfinite(w1) else max(raw.makespan, w0)
    span = end - w0
    up_backlogged, got, upstream_share = _upstream_shares(raw, span)
    basis = _Basis.of(raw, span, upstream_share)
    members: defaultdict[int, list[int]] = defaultdict(list)
    for t, g in enumerate(w.group_of):
        members[g].append(t)
    groups = tuple(basis.row(w.groups[g], ts) for g, ts in sorted(members.items()))
    tenants = tuple(basis.row(w.names[t], [t]) for t in range(w.tenants))
    classes = basis.classes()
    indices = [c.jain for c in classes if c.jain is not None]
    busy = [0.0] * len(w.lanes)
    for t, li in enumerate(w.lane_of):
        busy[li] += raw.served[t]
    return VariantResult(
        settings=raw.settings,
        submitted=sum(raw.submitted),
        completed=sum(raw.completed),
        rejections=dict(sorted(raw.rejections.items())),
        deferrals=dict(sorted(raw.deferrals.items())),
        lost=sum(raw.lost),
        unfinished=raw.unfinished,
        yields=raw.yields,
        parked=raw.parked,
        max_queue=raw.max_queued,
        max_deferred=raw.max_deferred,
        utilisation={
            lane.name: work / (lane.slots * span) if span > 0 else math.nan
            for lane, work in zip(w.lanes, busy, strict=True)
        },
        makespan=raw.makespan,
        window=(w0, end),
        wall=raw.wall,
        jain=min(indices) if indices else None,
        classes=classes,
        groups=groups,
        tenants=tenants,
        phases=tuple(p.name for p in raw.phases),
        series=tuple(raw.series),
        failed=sum(raw.failed),
        upstreams=tuple(
            _upstream(raw, u, span, got, up_backlogged) for u in range(len(w.upstreams))
        ),
    )


@dataclass(frozen=True, slots=True)
class _Basis:
    """What a run's rows are measured against: who was backlogged, and what each report
    class (and each class in each phase) served."""

    raw: Raw
    backlogged: list[bool]
    by_class: dict[int, list[int]]
    """Per report class, its backlogged tenants."""
    class_served: dict[int, float]
    class_weight: dict[int, float]
    phase_class: list[list[float]]
    upstream_share: Callable[[list[int]], tuple[float | None, float | None]]

    @classmethod
    def of(
        cls,
        raw: Raw,
        span: float,
        upstream_share: Callable[[list[int]], tuple[float | None, float | None]],
    ) -> _Basis:
        w = raw.world
        backlogged = [span > 0 and b >= BACKLOGGED * span for b in raw.backlog]
        by_class: defaultdict[int, list[int]] = defaultdict(list)
        for t in range(w.tenants):
            if backlogged[t]:
                by_class[w.ckey_of[t]].append(t)
        k = len(raw.phases)
        phase_class = [[0.0] * k for _ in w.ckeys]
        for t in range(w.tenants) if k else ():
            for i in range(k):
                phase_class[w.ckey_of[t]][i] += raw.phase_served[t][i]
        return cls(
            raw=raw,
            backlogged=backlogged,
            by_class=by_class,
            class_served={c: sum(raw.served[t] for t in ts) for c, ts in by_class.items()},
            class_weight={c: sum(w.weight[t] for t in ts) for c, ts in by_class.items()},
            phase_class=phase_class,
            upstream_share=upstream_share,
        )

    def row(self, name: str, members: list[int]) -> Row:
        """A tenant's row, or a group's (``members``: its tenants, of one class)."""
        raw, w, k = self.raw, self.raw.world, len(self.raw.phases)
        c = w.ckey_of[members[0]]
        mine = [t for t in members if self.backlogged[t]]
        served = self.class_served.get(c, 0.0)
        share = sum(raw.served[t] for t in mine) / served if mine and served else None
        fair = sum(w.weight[t] for t in mine) / self.class_weight[c] if mine else None
        limits = [raw.limit_range[t] for t in members if t in raw.limit_range]
        peaks = [raw.peak[t] for t in members if t in raw.peak]
        done = sum(raw.completed[t] for t in members)
        up_share, up_fair = self.upstream_share(members)
        phase_class = self.phase_class
        phase_shares = tuple(
            sum(raw.phase_served[t][i] for t in members) / phase_class[c][i]
            if phase_class[c][i] else None
            for i in range(k)
        )  # fmt: skip
        phase_limits = tuple(
            _span([raw.limit_phase[t][i] for t in members if t in raw.limit_phase])
            for i in range(k)
        )
        return Row(
            name=name,
            service_class=w.ckeys[c],
            tenants=len(members),
            weight=w.weight[members[0]],
            submitted=sum(raw.submitted[t] for t in members),
            completed=done,
            rejected=sum(raw.rejected[t] for t in members),
            lost=sum(raw.lost[t] for t in members),
            waits=Waits.of(x for t in members for x in raw.waits[t]),
            mean_response=sum(raw.resp[t] for t in members) / done if done else math.nan,
            backlogged=len(mine),
            share=share,
            fair_share=fair,
            limit=(min(lo for lo, _ in limits), max(hi for _, hi in limits)) if limits else None,
            peak=max(peaks) if peaks else None,
            phase_shares=phase_shares,
            phase_limits=phase_limits if any(phase_limits) else (),
            handoffs=Waits.of(float(x) for t in members for x in raw.handoffs[t])
            if any(raw.handoffs[t] for t in members)
            else None,
            done=Waits.of(x for t in members for x in raw.done[t]) if done else None,
            failed=sum(raw.failed[t] for t in members),
            up_share=up_share,
            up_fair=up_fair,
        )

    def classes(self) -> tuple[ClassRow, ...]:
        """Each report class's row: its waits, and Jain's index over its backlogged."""
        raw, w = self.raw, self.raw.world
        classes = []
        for c, name in enumerate(w.ckeys):
            ts = [t for t in range(w.tenants) if w.ckey_of[t] == c]
            xs = [raw.served[t] / w.weight[t] for t in self.by_class.get(c, [])]
            phase_p99 = tuple(percentile(sorted(v), 0.99) for v in raw.phase_waits[c])
            waits = Waits.of(x for t in ts for x in raw.waits[t])
            backlogged = len(self.by_class.get(c, []))
            classes.append(ClassRow(name, waits, backlogged, jain(xs), phase_p99))
        return tuple(classes)


def _upstream_shares(
    raw: Raw, span: float
) -> tuple[list[bool], list[float], Callable[[list[int]], tuple[float | None, float | None]]]:
    """Who is backlogged on its upstream, what each got, and a row's share of it."""
    w = raw.world
    backlogged = [span > 0 and p >= BACKLOGGED * span for p in raw.pend_time]
    got = _goodput(raw)
    weight: defaultdict[int, float] = defaultdict(float)
    total: defaultdict[int, float] = defaultdict(float)
    for t, u in enumerate(w.upstream_of):
        if u >= 0 and backlogged[t]:
            weight[u] += w.weight[t]
            total[u] += got[t]

    def share(members: list[int]) -> tuple[float | None, float | None]:
        u = w.upstream_of[members[0]]
        mine = [t for t in members if backlogged[t] and w.upstream_of[t] == u]
        if u < 0 or not mine or not total[u]:
            return None, None
        return sum(got[t] for t in mine) / total[u], sum(w.weight[t] for t in mine) / weight[u]

    return backlogged, got, share


def _goodput(raw: Raw) -> list[float]:
    """What each tenant got from its upstream in the window: tokens, else calls."""
    w = raw.world
    out = []
    for t, u in enumerate(w.upstream_of):
        tokens = u >= 0 and w.upstreams[u].tpm is not None
        out.append(raw.got_tokens[t] if tokens else float(raw.got_calls[t]))
    return out


def _facets(raw: Raw, k: int) -> str:
    w = raw.world
    rate, adaptive = w.key_rate[k], w.key_adaptive[k]
    parts = []
    if rate is not None:
        parts.append(f"{rate.limit:g}/{rate.per:g}s burst {rate.capacity:g} {rate.cost}")
    if adaptive is not None:
        parts.append(f"adaptive {adaptive.max}..{adaptive.min}")
    elif w.key_limit[k] and k in {j for keys in w.keys_of for j in keys}:
        limit = w.key_limit[k]
        if limit < 2**31 - 1:
            parts.append(f"limit {limit}")
    return ", ".join(parts) or "-"


def _upstream(
    raw: Raw, u: int, span: float, got: list[float], backlogged: list[bool]
) -> UpstreamRow:
    w = raw.world
    spec = w.upstreams[u]
    k = w.key_names.index(w.upstream_names[u])
    members = [t for t, x in enumerate(w.upstream_of) if x == u]
    calls_cap, tokens_cap = spec.capacity
    per_s = 1.0 / span if span > 0 else math.nan
    calls_s, tokens_s = raw.up_ok[u] * per_s, raw.up_tokens[u] * per_s
    ratios = [x / c for x, c in ((calls_s, calls_cap), (tokens_s, tokens_cap)) if c]
    xs = [got[t] / w.weight[t] for t in members if backlogged[t]]
    rk = raw.rate_keys
    held = any(w.upstream_key[t] == k for t in members)
    limits = None
    if rk is not None and held and w.key_adaptive[k] is not None:
        limits = (rk.low[k], rk.limit[k])
    return UpstreamRow(
        key=w.upstream_names[u],
        rate=_facets(raw, k) if held else "-",
        capacity_calls=calls_cap,
        capacity_tokens=tokens_cap,
        calls=raw.up_calls[u],
        throttled=raw.up_429[u],
        share_429=raw.up_429[u] / raw.up_calls[u] if raw.up_calls[u] else None,
        goodput_calls=calls_s,
        goodput_tokens=tokens_s,
        goodput=max(ratios) if ratios else None,
        jain=jain(xs),
        backlogged=len(xs),
        done=Waits.of(x for t in members for x in raw.done[t]),
        failed=sum(raw.failed[t] for t in members),
        pushbacks=sum(raw.pushed[t] for t in members),
        retried=sum(raw.retried[t] for t in members),
        limits=limits,
        refunded=rk.refunded[k] if rk is not None else 0.0,
        debt=rk.debt[k] if rk is not None else 0.0,
    )
