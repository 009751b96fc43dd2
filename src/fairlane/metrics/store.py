"""Store-side metrics, read at scrape time: lane capacity, slots, backlog, stats counters.

``StoreReader`` reads everything in one pipelined round trip on a synchronous
connection of its own (the scrape runs in the metrics server's thread, never on the
worker's event loop), with a bounded socket timeout, and reuses a read for
``max_age`` seconds: however often Prometheus and autoscalers poll, the server sees
at most one read per ``max_age``. ``StoreCollector`` turns the snapshot into metric
families; ``autoscale_view`` into the ``/autoscale`` JSON.

The oldest waiting job's age per class is not exported: jobs wait in one queue per
tenant, so finding the oldest means reading every active tenant's queue head.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from fairlane.store.keys import AppKeys

__all__ = ["LaneSnapshot", "StoreCollector", "StoreReader", "StoreSnapshot", "autoscale_view"]

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


@dataclass(frozen=True, slots=True)
class StoreSnapshot:
    lanes: dict[str, LaneSnapshot]
    stats: dict[str, int]
    throttle_waiters: int
    read_at: float = field(default_factory=time.monotonic)


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


class StoreReader:
    """Reads a ``StoreSnapshot`` of an app's lanes; thread-safe, cached, bounded in time."""

    def __init__(
        self,
        url: str,
        app: str,
        lanes: Sequence[str],
        *,
        timeout: float = 1.0,
        max_age: float = 2.0,
    ) -> None:
        self.keys = AppKeys.for_app(app)
        self.lanes = list(dict.fromkeys(lanes))
        self.max_age = max_age
        self._client: redis.Redis = redis.Redis.from_url(
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
        for lane in self.lanes:
            keys = self.keys.lane(lane)
            pipe.hgetall(keys.state)
            pipe.zcard(keys.delayed)
        pipe.hgetall(self.keys.stats)
        pipe.zcard(self.keys.throttle_waiters)
        reply: list[Any] = pipe.execute()
        lanes: dict[str, LaneSnapshot] = {}
        for i, lane in enumerate(self.lanes):
            raw, delayed = reply[2 * i], reply[2 * i + 1]
            fields = {_text(k): _text(v) for k, v in raw.items()}
            lanes[lane] = LaneSnapshot(
                capacity=max(0, int(fields.get("C", 0) or 0)),
                in_flight=_classes(fields, "f:"),
                waiting=_classes(fields, "d:"),
                deferred=_classes(fields, "ad:"),
                reserved_mu=_classes(fields, "ar:"),
                admitted=_classes(fields, "an:"),
                delayed=int(delayed),
            )
        stats_raw, waiters = reply[-2], reply[-1]
        stats = {_text(k): int(v) for k, v in stats_raw.items() if _text(k) != "seq"}
        return StoreSnapshot(lanes, stats, int(waiters))

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
