"""Store-side metrics, read at scrape time: lane capacity, slots, backlog, stats counters,
admission decisions, the age of the oldest waiting job, the work units estimated and
used, and each waiting tenant's entitled share.

``StoreReader`` reads on a synchronous connection of its own (the scrape runs in the
metrics server's thread, or the gateway's thread pool, never on an event loop), with a
bounded socket timeout, and reuses a read for ``max_age`` seconds: however often
Prometheus and autoscalers poll, the server sees at most one read per ``max_age``.
What it reads are the store's read models: the lanes, the stats hash and the throttle
waiters in one pipelined round trip (``fairlane.store.views.totals``), then the
oldest-job ages in up to three more, and only for classes with jobs waiting
(``fairlane.store.views.waits``, which says what they cost), then the rate keys (the
``rate_key_limit`` written most recently per shard) in one, or two when some key is
known (``fairlane.store.views.rates``; ``fairlane.metrics.rates`` says what is
exported and how the ``key`` label is bounded), then the active tenants of the classes
with jobs waiting and their weights in two more (``fairlane.store.views.shares``), and,
for an app of many shards, its global keys and each shard's part of them in up to three
(``fairlane.store.views.globalkeys``; ``fairlane.metrics.globalkeys``), and the
operators' pauses in one, or two when any pause is there (``fairlane.store.views.pauses``;
``fairlane.metrics.pauses``), then what the slots each lane needs are worked out from
in three (``fairlane.store.views.needs``; ``fairlane.metrics.needs``).
``StoreCollector`` turns
the snapshot into metric families; ``autoscale_view`` into the ``/autoscale`` JSON.

**The scale signal leaves batch out.** A batch class runs only on slots no other class
wants (``fairlane.policy.classes``), so its backlog is no reason to add workers: the
backlog an autoscaler reads (``/autoscale``'s ``backlog_total``, the gauge
``fairlane_lane_backlog_slots``) counts the waiting slots of a lane's non-batch
classes, and batch is reported apart (``backlog_batch``,
``fairlane_lane_batch_backlog_slots``); ``backlog`` and ``fairlane_lane_waiting_slots``
still give every class. Which classes are batch is what the reader is given
(``tables``: the app's declared lanes), else the default table's (``batch``).

**What the work needs.** ``/autoscale``'s ``slots_needed`` (and the gauge
``fairlane_lane_slots_needed{lane,for}``) is the largest of the slots every ready job
with a deadline needs to meet it (``slots_needed_deadlines``), the slots that clear the
backlog outside batch classes within ``horizon`` seconds (``slots_needed_horizon``), and
the slots in flight (``fairlane.policy.capacityneed`` derives them): the figure to scale
on when what matters is when work finishes, not how much of it waits.

**Paused work is no backlog either.** A job an operator's pause holds does not start
however many workers there are: the slots a paused lane, class or tenant holds back in
its queues (``fairlane_lane_paused_slots``; a paused task's or key's jobs are parked,
out of the waiting slots already) are left out of ``/autoscale``'s ``backlog``,
``backlog_total`` and ``backlog_batch`` and of the backlog gauges, and reported as
``paused``; ``fairlane_lane_waiting_slots`` still counts them.

Admission decisions are counted by the server itself, in the stats hash (written by
the enqueue script), so every process that scrapes the store (workers, gateways)
exports the same totals: ``fairlane_admission_decisions_total{lane,class,outcome,
reason}``, reasons as ``fairlane.policy.admission.reasons.COUNTED_REASONS`` names
them: ``none`` (accepted), a pool's (``class_full``, ``class_queue_full``,
``tenant_queue_full``, ``too_wide``), a lane's default queue bounds'
(``tenant_queue_full``, ``lane_queue_full``), ``deadline_unmeetable`` (a deadline
already past, or before the job's start) and ``class_not_entitled`` (a restricted
class the tenant is not entitled to). Refusals are counted in every lane; accepted and
deferred jobs only in lanes with an admission pool.
Not ``store_full``: a store above its memory mark refuses in the producer's process
before the script runs, and a server at its limit refuses the script itself, so
nothing is written to count; the gateway counts the refusals it answered
(``fairlane_gateway_admissions_total{reason="store_full"}``).

**Estimated against used.** In lanes that learn costs (an admission pool, or tenants
charged by cost), the ack script sums, per lane and class, the estimate the store held
for each settled attempt (admission's reservation -- declared or learned cost, times
the safety multiplier -- else the charge in cost mode) and the units it used:
``fairlane_work_units_estimated_total{lane,class}`` and
``fairlane_work_units_used_total{lane,class}``, whose rates' ratio says how far the
estimates run ahead of (or behind) the work. A worker's own metrics hold the raw usage
by tenant (``fairlane.metrics.recorder``).

**Entitled share.** ``fairlane_tenant_entitled_share{lane,class,tenant}``: for each
class with work waiting, each waiting tenant's weight over the sum of the waiting
tenants' weights, the share of dispatches fair queuing converges to
(``fairlane.store.views.shares``); next to ``fairlane_dispatched_jobs_total``, the
share each got. The ``tenant`` label is bounded: the ``tenant_top_n`` largest shares
of each class have one of their own, the rest are summed under ``other``.

An app split into scheduling shards (``App(shards=n)``) is read in every shard, in the
same round trips, and exported as one app, with the same names and labels: counts of
jobs and slots are summed over the shards, while a lane's capacity is the largest
shard's, as each counts the whole fleet's (``fairlane.store.views.lanes``); a counter
that dips below zero for a moment reads as 0 in its shard. The oldest waiting age is
the largest of the shards'.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from fairlane.metrics.globalkeys import global_key_families
from fairlane.metrics.needs import LaneNeed, lane_need, need_families, need_view
from fairlane.metrics.pauses import pause_families
from fairlane.metrics.rates import DEFAULT_KEY_TOP_N, rate_families
from fairlane.metrics.tenants import OTHER
from fairlane.policy.admission.reasons import COUNTED_REASONS
from fairlane.policy.capacityneed import DEFAULT_HORIZON_S
from fairlane.policy.classes import DEFAULT_CLASSES, ClassTable, ServiceClass
from fairlane.policy.shards import check_shard_count
from fairlane.store.connection import SyncClient, create_sync_client
from fairlane.store.keys import AppKeys
from fairlane.store.reads import run_sync
from fairlane.store.views.globalkeys import GlobalKeys, global_keys
from fairlane.store.views.lanes import LaneState, merge_lanes
from fairlane.store.views.needs import lane_needs
from fairlane.store.views.pauses import PausedWork, paused_work
from fairlane.store.views.rates import RateKeys, rate_keys
from fairlane.store.views.shares import entitled_shares
from fairlane.store.views.totals import DecisionKey, UnitsKey, app_totals
from fairlane.store.views.waits import oldest_waiting

__all__ = [
    "StoreCollector",
    "StoreReader",
    "StoreSnapshot",
    "autoscale_view",
]

log = logging.getLogger("fairlane.metrics")

#: Rate keys read per shard at a scrape: the most recently written
RATE_KEYS_READ = 500
#: Active tenants whose weights are read per class and shard for the entitled shares
SHARE_TENANTS_READ = 1000
#: Global keys read per shard at a scrape
GLOBAL_KEYS_READ = 500
#: Jobs read per lane and shard from the deadline index at a scrape, those due soonest
DEADLINES_READ = 1000
#: Active tenants whose queues are read per class and shard for the backlog's work
NEED_TENANTS_READ = 256


@dataclass(frozen=True, slots=True)
class StoreSnapshot:
    lanes: dict[str, LaneState]
    stats: dict[str, int]  # the stats hash but for ``fifo``, ``layout``, ``adm:`` fields
    throttle_waiters: int
    read_at: float = field(default_factory=time.monotonic)
    decisions: dict[DecisionKey, int] = field(default_factory=dict)
    oldest_age: dict[tuple[str, str], float] = field(default_factory=dict)  # seconds
    #: per lane, its batch classes (their backlog is no scale signal); a lane left out
    #: has the default table's
    batch: dict[str, frozenset[str]] = field(default_factory=dict)
    #: the rate keys read (``fairlane.metrics.rates``)
    rates: RateKeys = field(default_factory=RateKeys)
    #: work units estimated and used, per (lane, class, 'est' | 'used')
    units: dict[UnitsKey, float] = field(default_factory=dict)
    #: per (lane, class) with work waiting, each waiting tenant's entitled share
    shares: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    #: an app of many shards: its global keys and each shard's part of them
    global_keys: GlobalKeys = field(default_factory=GlobalKeys)
    #: what operators' pauses hold: by kind, parked, waiting slots held back
    paused: PausedWork = field(default_factory=PausedWork)
    #: per lane, the slots it needs (``fairlane.metrics.needs``)
    needs: dict[str, LaneNeed] = field(default_factory=dict)

    def batch_classes(self, lane: str) -> frozenset[str]:
        return self.batch.get(lane, _DEFAULT_BATCH)

    def ready(self, lane: str) -> dict[str, int]:
        """The lane's waiting slots per class that no operator's pause holds back."""
        held = self.paused.held
        waiting = self.lanes[lane].waiting
        return {cls: max(0, n - held.get((lane, cls), 0)) for cls, n in waiting.items()}

    def backlog(self, lane: str) -> tuple[int, int]:
        """The lane's waiting slots outside its batch classes (the scale signal), and in
        them; neither counts what a pause holds back."""
        batch = self.batch_classes(lane)
        ready = self.ready(lane)
        outside = sum(n for cls, n in ready.items() if cls not in batch)
        return outside, sum(n for cls, n in ready.items() if cls in batch)

    def paused_slots(self, lane: str) -> int:
        return sum(n for (name, _), n in self.paused.held.items() if name == lane)


def _batch_of(table: Iterable[ServiceClass]) -> frozenset[str]:
    return frozenset(c.name for c in table if c.batch)


_DEFAULT_BATCH = _batch_of(DEFAULT_CLASSES)


class StoreReader:
    """Reads a ``StoreSnapshot`` of an app's lanes; thread-safe, cached, bounded in time.

    The oldest waiting job of each lane's class is read as ``fairlane.store.views.waits``
    reads it: the queue heads of at most ``oldest_tenants`` active tenants per class with
    jobs waiting, so a read costs at most ``classes * (2 * oldest_tenants + 3)``
    commands per shard, each O(log n), however deep the queues and however many tenants
    are active (with more active tenants than that, the age is a lower bound).

    ``tables``: the lanes' class tables, which say which classes are batch (a lane left
    out has the default table). ``horizon``: seconds the backlog outside batch classes
    is to clear in (``slots_needed_horizon``; None: ``DEFAULT_HORIZON_S``, 300);
    ``deadlines``: jobs read per lane and shard from the deadline index, those due
    soonest (past them the deadline figure is a lower bound); ``need_tenants``: active
    tenants whose queues are read per class for the backlog's work (the rest counted at
    the class's mean).
    """

    def __init__(
        self,
        url: str,
        app: str,
        lanes: Sequence[str],
        *,
        timeout: float = 1.0,
        max_age: float = 2.0,
        oldest_tenants: int = 64,
        shards: int = 1,
        tables: Mapping[str, ClassTable] | None = None,
        rate_key_limit: int = RATE_KEYS_READ,
        share_tenants: int = SHARE_TENANTS_READ,
        horizon: float | None = None,
        deadlines: int = DEADLINES_READ,
        need_tenants: int = NEED_TENANTS_READ,
    ) -> None:
        if oldest_tenants < 1:
            raise ValueError(f"oldest_tenants must be >= 1, got {oldest_tenants}")
        if rate_key_limit < 1:
            raise ValueError(f"rate_key_limit must be >= 1, got {rate_key_limit}")
        self.rate_key_limit = rate_key_limit
        if share_tenants < 1:
            raise ValueError(f"share_tenants must be >= 1, got {share_tenants}")
        self.share_tenants = share_tenants
        horizon = DEFAULT_HORIZON_S if horizon is None else horizon
        if horizon <= 0 or deadlines < 1 or need_tenants < 1:
            raise ValueError(
                f"horizon must be > 0, deadlines and need_tenants >= 1: got {horizon}, "
                f"{deadlines}, {need_tenants}"
            )
        self.horizon, self.deadlines, self.need_tenants = horizon, deadlines, need_tenants
        check_shard_count(shards)
        #: the keys of each scheduling shard, in shard order
        self.shard_keys = [AppKeys.for_shard(app, i, shards) for i in range(shards)]
        self.keys = self.shard_keys[0]
        self.lanes = list(dict.fromkeys(lanes))
        self.batch = {lane: _batch_of(table) for lane, table in (tables or {}).items()}
        self.max_age = max_age
        self.oldest_tenants = oldest_tenants
        self._client: SyncClient = create_sync_client(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, max_connections=2
        )
        self._lock = threading.Lock()
        self._cached: StoreSnapshot | None = None
        self._failed_at: float | None = None

    def snapshot(self) -> StoreSnapshot | None:
        """The latest read if fresh enough, else a new one; None if the server failed to answer."""
        with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached.read_at < self.max_age:
                return self._cached
            if self._failed_at is not None and now - self._failed_at < self.max_age:
                return None
            try:
                self._cached, self._failed_at = self._read(), None
            except (RedisError, OSError, ValueError) as exc:
                log.warning("metrics: reading the store failed: %s", exc)
                self._cached, self._failed_at = None, now
            return self._cached

    def _read(self) -> StoreSnapshot:
        totals = run_sync(self._client, app_totals(self.shard_keys, self.lanes))
        per_shard = [
            {lane: state.clamped() for lane, state in shard.items()} for shard in totals.lanes
        ]
        oldest = run_sync(
            self._client, oldest_waiting(self.shard_keys, per_shard, self.oldest_tenants)
        )
        lanes = {lane: merge_lanes([shard[lane] for shard in per_shard]) for lane in self.lanes}
        rates = run_sync(self._client, rate_keys(self.shard_keys, self.rate_key_limit, head=0))
        shares = run_sync(
            self._client, entitled_shares(self.shard_keys, per_shard, self.share_tenants)
        )
        paused = run_sync(self._client, paused_work(self.shard_keys, per_shard))
        shared = GlobalKeys()
        if len(self.shard_keys) > 1:
            shared = run_sync(self._client, global_keys(self.shard_keys, GLOBAL_KEYS_READ))
        batch = {lane: self.batch.get(lane, _DEFAULT_BATCH) for lane in self.lanes}
        found = run_sync(
            self._client,
            lane_needs(self.shard_keys, per_shard, batch, self.deadlines, self.need_tenants),
        )
        needs = {
            lane: lane_need(
                lane,
                lanes[lane],
                found=found[lane],
                batch=batch[lane],
                held=paused.held,
                horizon_s=self.horizon,
            )
            for lane in self.lanes
        }
        return StoreSnapshot(
            lanes,
            totals.stats,
            totals.throttle_waiters,
            decisions=totals.decisions,
            oldest_age=oldest,
            batch=self.batch,
            rates=rates,
            units=totals.units,
            shares=shares,
            global_keys=shared,
            paused=paused,
            needs=needs,
        )

    def close(self) -> None:
        self._client.close()


def _per_class(
    name: str, doc: str, lanes: dict[str, LaneState], pick: Any, scale: float = 1.0
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["lane", "class"])
    for lane, state in lanes.items():
        for cls, n in sorted(pick(state).items()):
            family.add_metric([lane, cls], n * scale)
    return family


class StoreCollector(Collector):
    """Store-side metric families, from a ``StoreReader`` at each scrape; ``key_top_n``
    rate keys and as many global keys get a ``key`` label of their own
    (``fairlane.metrics.rates``, ``fairlane.metrics.globalkeys``), and the
    ``tenant_top_n`` largest entitled shares of each class a ``tenant`` label."""

    def __init__(
        self, reader: StoreReader, key_top_n: int = DEFAULT_KEY_TOP_N, tenant_top_n: int = 20
    ) -> None:
        self.reader = reader
        self.key_top_n = key_top_n
        self.tenant_top_n = tenant_top_n

    def describe(self) -> Iterable[Metric]:
        return []  # registration must not read the store

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        snap = self.reader.snapshot()
        up = GaugeMetricFamily("fairlane_store_up", "1 if the last store read succeeded.")
        up.add_metric([], 0 if snap is None else 1)
        yield up
        if snap is None:
            return
        age = GaugeMetricFamily(
            "fairlane_store_read_age_seconds",
            "Age of the (cached) store read these values come from.",
        )
        age.add_metric([], max(0.0, started - snap.read_at))
        yield age
        yield from _lane_families(snap)
        yield from _admission_families(snap.lanes)
        yield from _server_counters(snap)
        yield from _queue_and_work(snap)
        yield _shares(snap.shares, self.tenant_top_n)
        yield from rate_families(snap.rates, self.key_top_n)
        yield from global_key_families(snap.global_keys, self.key_top_n)
        yield from pause_families(snap.paused)
        yield from need_families(snap.needs)


def _lane_families(snap: StoreSnapshot) -> Iterator[Metric]:
    """Each lane's capacity, its slots running and waiting, and its backlog."""
    capacity = GaugeMetricFamily(
        "fairlane_lane_capacity_slots",
        "A lane's capacity C: its live workers' slots.",
        labels=["lane"],
    )
    delayed = GaugeMetricFamily(
        "fairlane_lane_delayed_jobs",
        "Jobs scheduled to run later (delay, at, retry backoff).",
        labels=["lane"],
    )
    for lane, state in snap.lanes.items():
        capacity.add_metric([lane], state.capacity)
        delayed.add_metric([lane], state.delayed)
    yield capacity
    yield delayed
    lanes = snap.lanes
    yield _per_class(
        "fairlane_lane_in_flight_slots",
        "Slots held by running jobs.",
        lanes,
        lambda s: s.in_flight,
    )
    yield _per_class(
        "fairlane_lane_waiting_slots",
        "Slots of jobs queued and ready to run.",
        lanes,
        lambda s: s.waiting,
    )
    backlog = GaugeMetricFamily(
        "fairlane_lane_backlog_slots",
        "Slots of jobs queued and ready to run outside the lane's batch classes, but for "
        "those an operator's pause holds back: the signal to scale on.",
        labels=["lane"],
    )
    batch = GaugeMetricFamily(
        "fairlane_lane_batch_backlog_slots",
        "Slots of jobs queued and ready to run in the lane's batch classes (they run on "
        "spare slots only: no signal to scale on).",
        labels=["lane"],
    )
    for lane in lanes:
        outside, inside = snap.backlog(lane)
        backlog.add_metric([lane], outside)
        batch.add_metric([lane], inside)
    yield backlog
    yield batch


def _admission_families(lanes: dict[str, LaneState]) -> Iterator[Metric]:
    """Admission's deferred and admitted jobs and its reserved units, by lane and class."""
    yield _per_class(
        "fairlane_lane_deferred_jobs", "Jobs admission deferred.", lanes, lambda s: s.deferred
    )
    yield _per_class(
        "fairlane_lane_admitted_jobs",
        "Admitted jobs holding an admission reservation.",
        lanes,
        lambda s: s.admitted,
    )
    yield _per_class(
        "fairlane_lane_reserved_units",
        "Work units admission has reserved.",
        lanes,
        lambda s: s.reserved_mu,
        scale=0.001,
    )


def _server_counters(snap: StoreSnapshot) -> Iterator[Metric]:
    """The throttle waiters, the app's event counters and the admission decisions."""
    waiters = GaugeMetricFamily(
        "fairlane_throttle_waiters", "Jobs waiting for a throttle key's grant."
    )
    waiters.add_metric([], snap.throttle_waiters)
    yield waiters
    events = CounterMetricFamily(
        "fairlane_store_events",
        "The server's counters of the app (stats hash): completed, failed, rejected, "
        "deferred, admitted, retried, fenced, expired, suspended, reclaimed, ...",
        labels=["event"],
    )
    for name, n in sorted(snap.stats.items()):
        events.add_metric([name], n)
    yield events
    decisions = CounterMetricFamily(
        "fairlane_admission_decisions",
        "Admission decisions on submitted jobs, counted by the server: outcome "
        "accepted, deferred or rejected; reason " + ", ".join(COUNTED_REASONS) + ". "
        "Refusals in every lane; accepted and deferred jobs in lanes with a pool. Not "
        "store_full: those are refused before the script runs, with nothing written "
        "(the gateway counts its own).",
        labels=["lane", "class", "outcome", "reason"],
    )
    for key, n in sorted(snap.decisions.items()):
        decisions.add_metric(list(key), n)
    yield decisions


def _queue_and_work(snap: StoreSnapshot) -> Iterator[Metric]:
    """The oldest ready job's age, and the work units estimated against those used."""
    oldest = GaugeMetricFamily(
        "fairlane_queue_oldest_age_seconds",
        "Seconds the oldest job ready to run has waited, by lane and class (0: none "
        "waits; the heads of at most N active tenants' queues are read).",
        labels=["lane", "class"],
    )
    for (lane, cls), waited in sorted(snap.oldest_age.items()):
        oldest.add_metric([lane, cls], waited)
    yield oldest
    estimated = CounterMetricFamily(
        "fairlane_work_units_estimated",
        "Work units the store estimated for the attempts settled in lanes that learn "
        "costs (admission's reservation, else the charge in cost mode).",
        labels=["lane", "class"],
    )
    used = CounterMetricFamily(
        "fairlane_work_units_used",
        "Work units those same attempts used, as their workers priced them.",
        labels=["lane", "class"],
    )
    for (lane, cls, kind), units in sorted(snap.units.items()):
        (estimated if kind == "est" else used).add_metric([lane, cls], units)
    yield estimated
    yield used


def _shares(shares: Mapping[tuple[str, str], Mapping[str, float]], top_n: int) -> Metric:
    family = GaugeMetricFamily(
        "fairlane_tenant_entitled_share",
        "The share of a class's dispatches a tenant with work waiting is entitled to: its "
        "weight over the waiting tenants' weights (the largest shares labelled, the rest "
        "summed as other).",
        labels=["lane", "class", "tenant"],
    )
    for (lane, cls), by_tenant in sorted(shares.items()):
        ranked = sorted(by_tenant.items(), key=lambda kv: (-kv[1], kv[0]))
        rest = 0.0
        for i, (tenant, share) in enumerate(ranked):
            if i < top_n and tenant not in ("", OTHER):
                family.add_metric([lane, cls, tenant], share)
            else:
                rest += share
        if rest > 0:
            family.add_metric([lane, cls, OTHER], rest)
    return family


def autoscale_view(snap: StoreSnapshot | None) -> dict[str, Any]:
    """The ``/autoscale`` JSON: per lane, slots total and used, the backlog per class, and
    ``backlog_total``, the slots waiting outside batch classes (the signal to scale on),
    with ``backlog_batch`` apart; none counts the slots operators' pauses hold back,
    which are ``paused``. ``slots_needed`` is the figure to scale on by what the work
    needs: the largest of ``slots_needed_deadlines``, ``slots_needed_horizon`` and the
    slots in flight (``fairlane.metrics.needs``)."""
    if snap is None:
        return {"ok": False, "lanes": {}}
    lanes: dict[str, Any] = {}
    for lane, state in snap.lanes.items():
        outside, inside = snap.backlog(lane)
        used = sum(state.in_flight.values())
        lanes[lane] = {
            "slots_total": state.capacity,
            "slots_used": used,
            "backlog": dict(sorted(snap.ready(lane).items())),
            "backlog_total": outside,
            "backlog_batch": inside,
            "paused": snap.paused_slots(lane),
            "delayed": state.delayed,
            "deferred": sum(state.deferred.values()),
            **need_view(snap.needs.get(lane), used),
        }
    return {"ok": True, "lanes": lanes}
