"""How long jobs wait: the oldest waiting job of each class, and recent start delays.

**The oldest waiting job** of a lane's class (:func:`oldest_waiting`, the metrics'
``fairlane_queue_oldest_age_seconds``): jobs wait in one queue per tenant and no index
orders them across tenants, so the read looks at the queue heads of at most ``tenants``
active tenants per class and takes the largest age among them (a job a throttle key
woke is back in its tenant's queue, so it is among them). It reads only classes with
waiting slots above zero, in three round trips: the tenants of each such class
(``ZRANGE fair -N -1``), their queue heads (``ZRANGE q 0 0``), then those jobs'
``run``/``enq`` fields with the server's ``TIME``. So a read costs at most ``classes *
(2 * tenants + 1) + 1`` commands per shard, each O(log n), however deep the queues and
however many tenants are active.

The tenants read are those with the highest start tags: fair dispatch serves the
lowest tags first, so those at the top are the ones made to wait longest. With more
active tenants than the cap the value is a lower bound. A queue head is the job its
tenant runs next (highest priority, then first in); its age counts from when it became
eligible to run (its ``run`` time: after any delay or retry backoff; time deferred by
admission counts as waiting), on the clock of the server of its shard (one ``TIME``
per shard that has a queue head).

**Start delays** (:func:`start_delays`, the dashboard's percentiles): the store keeps
no histogram, so they come from the most recent completed records that retention
keeps (``kept:<task>:ok``, at most ``sample`` per task, the newest of all shards
merged by finish time): the time from a job's last attempt becoming eligible to its
start (``start - run``).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from fairlane.store.fields import field_text
from fairlane.store.keys import AppKeys
from fairlane.store.reads import Plan, cmd, server_time
from fairlane.store.records import AGE, DELAYS, JobRecord, from_values, job_fields
from fairlane.store.views.lanes import LaneState

__all__ = ["StartDelays", "oldest_waiting", "start_delays"]

#: (shard, lane, class) of a class's queues in one shard
_Where = tuple[int, str, str]


def oldest_waiting(
    keys: Sequence[AppKeys], lanes: Sequence[dict[str, LaneState]], tenants: int
) -> Plan[dict[tuple[str, str], float]]:
    """Seconds the oldest queue head of each lane's class has waited in any shard (0:
    none waits), for the classes of ``lanes`` (each shard's, in shard order)."""
    ages: dict[tuple[str, str], float] = {}
    busy: list[_Where] = []
    for shard, states in enumerate(lanes):
        for lane, state in states.items():
            for cls, n in state.waiting.items():
                ages.setdefault((lane, cls), 0.0)
                if n > 0:
                    busy.append((shard, lane, cls))
    heads = (yield from _queue_heads(keys, busy, tenants)) if busy else []
    if not heads:
        return ages
    shards = sorted({where[0] for where, _ in heads})
    fields = job_fields(AGE)
    reply = yield [
        *(cmd("hmget", keys[where[0]].job(job), fields) for where, job in heads),
        # after the reads: an age is never counted from a clock read before its record
        *(server_time(keys[shard].stats) for shard in shards),
    ]
    now_ms = dict(zip(shards, reply[len(heads) :], strict=True))
    for ((shard, lane, cls), job), values in zip(heads, reply, strict=False):
        record = from_values(job, AGE, values)
        since = None if record is None else _eligible_since(record)
        if since is None:
            continue  # the record went away between the reads
        age = max(0.0, (now_ms[shard] - since) / 1000)
        ages[(lane, cls)] = max(ages[(lane, cls)], age)
    return ages


def _eligible_since(record: JobRecord) -> int | None:
    return record.run_ms if record.run_ms is not None else record.enqueued_ms


def _queue_heads(
    keys: Sequence[AppKeys], busy: list[_Where], tenants: int
) -> Plan[list[tuple[_Where, str]]]:
    """The jobs at the heads of the queues of up to ``tenants`` tenants of each class
    with jobs waiting."""
    reply = yield [
        cmd("zrange", keys[shard].class_key(lane, cls, "fair"), -tenants, -1)
        for shard, lane, cls in busy
    ]
    heads: list[tuple[_Where, str]] = []
    queued: list[_Where] = []
    queues = []
    for i, where in enumerate(busy):
        shard, lane, cls = where
        for tenant in reply[i]:
            queue = keys[shard].tenant_queue(lane, cls, field_text(tenant))
            queues.append(cmd("zrange", queue, 0, 0))
            queued.append(where)
    for where, got in zip(queued, (yield queues), strict=True):
        heads.extend((where, field_text(job)) for job in got)
    return heads


@dataclass(frozen=True, slots=True)
class StartDelays:
    """Start delays (ms) of recently completed jobs, by (lane, class) and by tenant."""

    by_class: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    by_tenant: dict[str, list[int]] = field(default_factory=dict)


def start_delays(keys: Sequence[AppKeys], tasks: Sequence[str], sample: int) -> Plan[StartDelays]:
    """The start delays of the ``sample`` most recently completed jobs of each task."""
    reply = yield [
        cmd("zrevrange", k.kept(task, "ok"), 0, sample - 1, withscores=True)
        for task in tasks
        for k in keys
    ]
    shards = len(keys)
    picked: list[tuple[int, str]] = []
    for i in range(len(tasks)):
        batches = reply[i * shards : (i + 1) * shards]
        newest = heapq.nlargest(
            sample,
            (
                (score, shard, field_text(job))
                for shard, got in enumerate(batches)
                for job, score in got
            ),
        )
        picked.extend((shard, job) for _, shard, job in newest)
    fields = job_fields(DELAYS)
    reply = yield [cmd("hmget", keys[shard].job(job), fields) for shard, job in picked]
    by_class: dict[tuple[str, str], list[int]] = defaultdict(list)
    by_tenant: dict[str, list[int]] = defaultdict(list)
    for (_, job), values in zip(picked, reply, strict=True):
        record = from_values(job, DELAYS, values)
        if record is None or record.started_ms is None or record.run_ms is None:
            continue
        delay = max(0, record.started_ms - record.run_ms)
        by_class[(record.lane, record.service_class)].append(delay)
        by_tenant[record.tenant].append(delay)
    return StartDelays(dict(by_class), dict(by_tenant))
