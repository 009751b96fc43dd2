"""Store-side metrics, read at scrape time: lane capacity, slots, backlog, stats counters,
admission decisions and the age of the oldest waiting job.

``StoreReader`` reads on a synchronous connection of its own (the scrape runs in the
metrics server's thread, or the gateway's thread pool, never on an event loop), with a
bounded socket timeout, and reuses a read for ``max_age`` seconds: however often
Prometheus and autoscalers poll, the server sees at most one read per ``max_age``.
The lanes, the stats hash and the throttle waiters come in one pipelined round trip;
the oldest-job ages take up to three more, and only for classes with jobs waiting
(see ``StoreReader``). ``StoreCollector`` turns the snapshot into metric families;
``autoscale_view`` into the ``/autoscale`` JSON.

Admission decisions are counted by the server itself, in the stats hash (fields
``adm:<outcome>:<reason>:<lane>:<class>``, written by the enqueue script), so every
process that scrapes the store (workers, gateways) exports the same totals.

An app split into scheduling shards (``App(shards=n)``) is read in every shard, in the
same round trips, and exported as one app, with the same names and labels: counts of
jobs and slots (in flight, waiting, deferred, delayed, admitted, reserved, the stats
counters, the decisions, the throttle waiters) are summed over the shards, while a
lane's capacity is not: every worker registers its whole size in every shard, so each
shard's ``C`` is already the fleet's (the largest is taken, in case a shard has not
heard from a new worker yet). The oldest waiting age is the largest of the shards'.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from fairlane.policy.shards import check_shard_count
from fairlane.store.connection import SyncClient, create_sync_client, sync_server_time_ms
from fairlane.store.keys import AppKeys

__all__ = [
    "DECISION_PREFIX",
    "DecisionKey",
    "LaneSnapshot",
    "StoreCollector",
    "StoreReader",
    "StoreSnapshot",
    "autoscale_view",
]

log = logging.getLogger("fairlane.metrics")


@dataclass(frozen=True, slots=True)
class LaneSnapshot:
    """One lane's cached state (``lane:<l>:state``) and its delayed count."""

    capacity: int
    in_flight: dict[str, int]  # class -> slots (f:<c>)
    waiting: dict[str, int]  # class -> queued slots (d:<c>)
    deferred: dict[str, int]  # class -> deferred jobs (ad:<c>)
    reserved_mu: dict[str, int]  # class -> reserved milli-units (ar:<c>)
    admitted: dict[str, int]  # class -> admitted jobs holding a reservation (an:<c>)
    delayed: int  # jobs scheduled for later (lane:<l>:delayed)


#: (lane, class, outcome, reason) of an admission decision counter
DecisionKey = tuple[str, str, str, str]


@dataclass(frozen=True, slots=True)
class StoreSnapshot:
    lanes: dict[str, LaneSnapshot]
    stats: dict[str, int]  # the stats hash but for ``seq`` and the ``adm:`` fields
    throttle_waiters: int
    read_at: float = field(default_factory=time.monotonic)
    decisions: dict[DecisionKey, int] = field(default_factory=dict)
    oldest_age: dict[tuple[str, str], float] = field(default_factory=dict)  # seconds


#: (shard, lane, class) of a class's queues in one shard
_Where = tuple[int, str, str]

#: Prefix of the stats-hash fields counting admission decisions (admission.lua).
DECISION_PREFIX = "adm:"


def _split_stats(raw: dict[str, int]) -> tuple[dict[str, int], dict[DecisionKey, int]]:
    """The stats hash as plain counters and admission decisions."""
    stats: dict[str, int] = {}
    decisions: dict[DecisionKey, int] = {}
    for name, n in raw.items():
        if name == "seq":
            continue
        if not name.startswith(DECISION_PREFIX):
            stats[name] = n
            continue
        parts = name[len(DECISION_PREFIX) :].split(":")
        if len(parts) == 4:  # outcome, reason, lane, class
            outcome, reason, lane, cls = parts
            decisions[(lane, cls, outcome, reason)] = n
    return stats, decisions


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _classes(fields: dict[str, str], prefix: str) -> dict[str, int]:
    n = len(prefix)
    out: dict[str, int] = {}
    for k, v in fields.items():
        if k.startswith(prefix):
            try:
                out[k[n:]] = max(0, int(v))  # cached counters may dip below 0 briefly
            except ValueError:
                continue
    return out


def _lane_snapshot(raw: dict[Any, Any], delayed: int) -> LaneSnapshot:
    fields = {_text(k): _text(v) for k, v in raw.items()}
    return LaneSnapshot(
        capacity=max(0, int(fields.get("C", 0) or 0)),
        in_flight=_classes(fields, "f:"),
        waiting=_classes(fields, "d:"),
        deferred=_classes(fields, "ad:"),
        reserved_mu=_classes(fields, "ar:"),
        admitted=_classes(fields, "an:"),
        delayed=int(delayed),
    )


def _summed(parts: Iterable[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in parts:
        for cls, n in part.items():
            out[cls] = out.get(cls, 0) + n
    return out


def _merge(shards: list[LaneSnapshot]) -> LaneSnapshot:
    """One lane as the shards hold it together: their jobs and slots summed, the
    capacity not, as each shard counts the whole fleet's."""
    if len(shards) == 1:
        return shards[0]
    return LaneSnapshot(
        capacity=max(s.capacity for s in shards),
        in_flight=_summed(s.in_flight for s in shards),
        waiting=_summed(s.waiting for s in shards),
        deferred=_summed(s.deferred for s in shards),
        reserved_mu=_summed(s.reserved_mu for s in shards),
        admitted=_summed(s.admitted for s in shards),
        delayed=sum(s.delayed for s in shards),
    )


class StoreReader:
    """Reads a ``StoreSnapshot`` of an app's lanes; thread-safe, cached, bounded in time.

    The oldest waiting job of a lane's class: jobs wait in one queue per tenant, and no
    index orders them across tenants, so the reader looks at the queue heads of at most
    ``oldest_tenants`` active tenants per class (and the head of the class's throttle-
    granted set), and takes the largest age among them. It reads only classes whose
    waiting slots (``d:<class>``) are above zero, in three pipelined round trips: the
    tenants of each such class (``ZRANGE fair -N -1``), their queue heads (``ZRANGE q 0
    0``), then those jobs' ``run``/``enq`` fields with the server's ``TIME``. So a read
    costs at most ``classes * (2 * oldest_tenants + 3)`` commands, each O(log n), however
    deep the queues and however many tenants are active.

    The tenants read are those with the highest start tags: fair dispatch serves the
    lowest tags first, so the tenants at the top are the ones made to wait longest. With
    more active tenants than the cap the value is a lower bound. A queue head is the job
    its tenant runs next (highest priority, then first in); a job's age counts from when
    it became eligible to run (its ``run`` time: after any delay or retry backoff; time
    spent deferred by admission counts as waiting), on the server's clock.

    With ``shards`` above one, every shard is read in the same round trips (a class is
    looked at in each shard where it has jobs waiting, so the bound above holds per
    shard), and the oldest-age read adds one ``TIME`` per shard that has a queue head.
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
    ) -> None:
        if oldest_tenants < 1:
            raise ValueError(f"oldest_tenants must be >= 1, got {oldest_tenants}")
        check_shard_count(shards)
        #: the keys of each scheduling shard, in shard order
        self.shard_keys = [AppKeys.for_shard(app, i, shards) for i in range(shards)]
        self.keys = self.shard_keys[0]
        self.lanes = list(dict.fromkeys(lanes))
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
        pipe = self._client.pipeline(transaction=False)
        for keys in self.shard_keys:
            for lane in self.lanes:
                pipe.hgetall(keys.lane(lane).state)
                pipe.zcard(keys.lane(lane).delayed)
            pipe.hgetall(keys.stats)
            pipe.zcard(keys.throttle_waiters)
        reply: list[Any] = pipe.execute()
        per_shard: list[dict[str, LaneSnapshot]] = []
        raw_stats: dict[str, int] = {}
        waiters = 0
        width = 2 * len(self.lanes) + 2  # replies per shard
        for n in range(len(self.shard_keys)):
            part = reply[n * width : (n + 1) * width]
            per_shard.append(
                {
                    lane: _lane_snapshot(part[2 * i], part[2 * i + 1])
                    for i, lane in enumerate(self.lanes)
                }
            )
            for k, v in part[-2].items():
                name = _text(k)
                raw_stats[name] = raw_stats.get(name, 0) + int(v)
            waiters += int(part[-1])
        stats, decisions = _split_stats(raw_stats)
        oldest = self._oldest_ages(per_shard)
        lanes = {lane: _merge([shard[lane] for shard in per_shard]) for lane in self.lanes}
        return StoreSnapshot(lanes, stats, waiters, decisions=decisions, oldest_age=oldest)

    def _oldest_ages(
        self, per_shard: list[dict[str, LaneSnapshot]]
    ) -> dict[tuple[str, str], float]:
        """Seconds the oldest queue head of each lane's class has waited, in any shard
        (0: none waits)."""
        ages: dict[tuple[str, str], float] = {}
        busy: list[_Where] = []
        for shard, lanes in enumerate(per_shard):
            for lane, state in lanes.items():
                for cls, n in state.waiting.items():
                    ages.setdefault((lane, cls), 0.0)
                    if n > 0:
                        busy.append((shard, lane, cls))
        heads = self._queue_heads(busy) if busy else []
        if not heads:
            return ages
        pipe = self._client.pipeline(transaction=False)
        for (shard, _, _), job in heads:
            pipe.hmget(self.shard_keys[shard].job(job), "run", "enq")
        reply: list[Any] = pipe.execute()
        # a cluster pipeline refuses TIME, which names no key: it is read on its own, from
        # each shard's node, whose clock that shard's scripts wrote the times with
        now_ms = {
            shard: sync_server_time_ms(self._client, self.shard_keys[shard].stats)
            for shard in sorted({where[0] for where, _ in heads})
        }
        for ((shard, lane, cls), _), (run, enq) in zip(heads, reply, strict=True):
            since = run if run is not None else enq
            if since is None:
                continue  # the record went away between the reads
            age = max(0.0, (now_ms[shard] - int(since)) / 1000)
            ages[(lane, cls)] = max(ages[(lane, cls)], age)
        return ages

    def _queue_heads(self, busy: list[_Where]) -> list[tuple[_Where, str]]:
        """The jobs at the heads of the queues of classes with jobs waiting: the granted
        set's, and those of up to ``oldest_tenants`` tenants' queues."""
        pipe = self._client.pipeline(transaction=False)
        for shard, lane, cls in busy:
            keys = self.shard_keys[shard]
            pipe.zrange(keys.class_key(lane, cls, "fair"), -self.oldest_tenants, -1)
            pipe.zrange(keys.class_key(lane, cls, "granted"), 0, 0)
        reply: list[Any] = pipe.execute()
        heads: list[tuple[_Where, str]] = []
        pipe = self._client.pipeline(transaction=False)
        queued: list[_Where] = []
        for i, where in enumerate(busy):
            shard, lane, cls = where
            for tenant in reply[2 * i]:
                pipe.zrange(self.shard_keys[shard].tenant_queue(lane, cls, _text(tenant)), 0, 0)
                queued.append(where)
            heads.extend((where, _text(job)) for job in reply[2 * i + 1])
        for where, got in zip(queued, pipe.execute(), strict=True):
            heads.extend((where, _text(job)) for job in got)
        return heads

    def close(self) -> None:
        self._client.close()


def _per_class(
    name: str, doc: str, lanes: dict[str, LaneSnapshot], pick: Any, scale: float = 1.0
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["lane", "class"])
    for lane, state in lanes.items():
        for cls, n in sorted(pick(state).items()):
            family.add_metric([lane, cls], n * scale)
    return family


class StoreCollector(Collector):
    """Store-side metric families, from a ``StoreReader`` at each scrape."""

    def __init__(self, reader: StoreReader) -> None:
        self.reader = reader

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
            "accepted, deferred or rejected; reason none (accepted), class_full, "
            "class_queue_full, tenant_queue_full or too_wide.",
            labels=["lane", "class", "outcome", "reason"],
        )
        for key, n in sorted(snap.decisions.items()):
            decisions.add_metric(list(key), n)
        yield decisions
        oldest = GaugeMetricFamily(
            "fairlane_queue_oldest_age_seconds",
            "Seconds the oldest job ready to run has waited, by lane and class (0: none "
            "waits; the heads of at most N active tenants' queues are read).",
            labels=["lane", "class"],
        )
        for (lane, cls), waited in sorted(snap.oldest_age.items()):
            oldest.add_metric([lane, cls], waited)
        yield oldest


def autoscale_view(snap: StoreSnapshot | None) -> dict[str, Any]:
    """The ``/autoscale`` JSON: per lane, slots total and used, and backlog per class."""
    if snap is None:
        return {"ok": False, "lanes": {}}
    lanes: dict[str, Any] = {}
    for lane, state in snap.lanes.items():
        backlog = dict(sorted(state.waiting.items()))
        lanes[lane] = {
            "slots_total": state.capacity,
            "slots_used": sum(state.in_flight.values()),
            "backlog": backlog,
            "backlog_total": sum(backlog.values()),
            "delayed": state.delayed,
            "deferred": sum(state.deferred.values()),
        }
    return {"ok": True, "lanes": lanes}
