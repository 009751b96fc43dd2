"""What the slots a lane needs are worked out from (``fairlane.policy.capacityneed``), as
the metrics and ``/autoscale`` read it at a scrape: the jobs waiting with a deadline, the
work waiting outside batch classes, and how long the slots in flight stay held.

**Deadline jobs** are read from each lane's deadline index (``lane:<l>:dl``,
``fairlane/store/keys.py``): every unfinished job with a deadline, by deadline, written
by enqueue only for jobs that have one and left by each at its finish, so the hot path
of a job without a deadline pays nothing for it. The first ``deadlines`` entries are
read (``ZRANGE 0 N-1``) and each one's record checked: only a job ready to run (status
``queued``, not parked by a pause) counts; a running, scheduled, deferred or throttled
one does not wait for a slot. Entries past the first ``deadlines`` are ``unread``: the
deadline figure is then a lower bound (the jobs read are those due soonest). A job's
length is what dispatch's deadline check reads (its task's learned ms for its tenant,
else for every tenant; ``lua/estimate.lua``), else its tenant's or class's learned
slot-ms over its width; nothing learned: None.

**The backlog outside batch** is read per class with slots waiting, as a start-time
estimate reads it: the first ``tenants`` of the class's active tenants, each queue's
length and the tenant's learned slot-ms per job in the class (else the class's); with
more active tenants than that, the rest of the class's waiting slots count as jobs at
the class's mean (jobs no wider than a slot, so never less work than there is).

**Slots in flight** stay held about half their class's learned mean (None: nothing
learned).

Read in three round trips, however deep the queues: the indexes' heads and sizes, the
classes' tenants and each shard's clock; the jobs' records, the queues' lengths and the
learned means (one ``HMGET`` of the shard's ``dur`` and one of each tenant's own
``dur:<tenant>``); the deadline jobs' learned lengths (the same, for their tenants). So
a read costs, per shard, at most ``lanes * (2 + 2 * deadlines) + classes * (2 + 2 *
tenants) + 3`` commands.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from fairlane.policy.capacityneed import DeadlineJob, Queued, Running
from fairlane.store.durations import class_field, stored_at, task_field, tenant_field
from fairlane.store.fields import field_int, field_text
from fairlane.store.keys import AppKeys
from fairlane.store.reads import Cmd, Plan, cmd, server_time
from fairlane.store.records import from_values, job_fields
from fairlane.store.views.lanes import LaneState

__all__ = ["LaneNeeds", "lane_needs"]

#: what a deadline job's record is read for
_RECORD: Final = ("status", "tenant", "service_class", "task", "slots", "paused_under")


@dataclass(slots=True)
class LaneNeeds:
    """One lane's inputs to the rule: its ready deadline jobs by class, the deadline
    index's entries not read, the waiting work outside batch by class, and the slots in
    flight by class (one entry per shard)."""

    deadlines: list[tuple[str, DeadlineJob]] = field(default_factory=list)
    unread: int = 0
    queued: dict[str, list[Queued]] = field(default_factory=dict)
    running: dict[str, list[Running]] = field(default_factory=dict)


def lane_needs(
    keys: Sequence[AppKeys],
    lanes: Sequence[Mapping[str, LaneState]],
    batch: Mapping[str, frozenset[str]],
    deadlines: int,
    tenants: int,
) -> Plan[dict[str, LaneNeeds]]:
    """Each lane's inputs, over every shard; ``lanes`` are each shard's lane states (in
    shard order), ``batch`` each lane's batch classes."""
    out = {lane: LaneNeeds() for states in lanes for lane in states}
    shards = [_Shard(k, states, batch, out) for k, states in zip(keys, lanes, strict=True)]
    reads: list[Cmd] = []
    for shard in shards:
        shard.ask_heads(reads, deadlines, tenants)
    replies = yield reads
    reads = []
    for shard in shards:
        shard.read_heads(replies)
        shard.ask_records(reads)
    replies = yield reads
    reads = []
    for shard in shards:
        shard.read_records(replies)
        shard.ask_lengths(reads)
    replies = yield reads
    for shard in shards:
        shard.read_lengths(replies)
    return out


def _place(reads: list[Cmd], c: Cmd) -> int:
    reads.append(c)
    return len(reads) - 1


def _number(raw: Any) -> float | None:
    try:
        return float(field_text(raw)) if raw is not None else None
    except ValueError:
        return None


def _learned(fields: Sequence[str], reply: Sequence[Any]) -> dict[str, float]:
    """The learned means an ``HMGET`` found (ms), by field."""
    got = zip(fields, reply, strict=True)
    return {f: v for f, raw in got if (v := _number(raw)) is not None}


_Asked = list[tuple[int, list[str]]]  # an HMGET's place in the replies, the fields it asked


def _ask_learned(reads: list[Cmd], keys: AppKeys, fields: Sequence[str]) -> _Asked:
    """One ``HMGET`` per hash the learned means ``fields`` are kept in (``stored_at``)."""
    by_key: dict[str, list[tuple[str, str]]] = {}
    for f in fields:
        key, inner = stored_at(keys, f)
        by_key.setdefault(key, []).append((inner, f))
    return [
        (_place(reads, cmd("hmget", key, [inner for inner, _ in pairs])), [f for _, f in pairs])
        for key, pairs in by_key.items()
    ]


def _read_learned(replies: list[Any], asked: _Asked) -> dict[str, float]:
    means: dict[str, float] = {}
    for at, fields in asked:
        means.update(_learned(fields, replies[at]))
    return means


@dataclass(slots=True)
class _Ready:
    """A deadline job found ready to run, before its length is read."""

    lane: str
    cls: str
    left_s: float
    slots: int
    task: str
    tenant: str

    def fields(self) -> tuple[str, str, str, str]:
        """Where its length is learned, most specific first: its task's ms for its
        tenant and for all, its tenant's and its class's slot-ms."""
        return (
            task_field(self.task, self.tenant),
            task_field(self.task),
            tenant_field(self.lane, self.cls, self.tenant),
            class_field(self.lane, self.cls),
        )

    def length_s(self, means: Mapping[str, float]) -> float | None:
        own, task, tenant, cls = (means.get(f) for f in self.fields())
        if own is not None or task is not None:
            return (own if own is not None else task or 0.0) / 1000
        slot_ms = tenant if tenant is not None else cls
        return None if slot_ms is None else slot_ms / self.slots / 1000


@dataclass(slots=True)
class _Shard:
    """One shard's part of the read: the places of its commands in each round trip's
    replies, and what it found."""

    keys: AppKeys
    lanes: Mapping[str, LaneState]
    batch: Mapping[str, frozenset[str]]
    out: dict[str, LaneNeeds]
    index: dict[str, int] = field(default_factory=dict)  # lane -> ZCARD; ZRANGE follows
    fair: list[tuple[str, str, int]] = field(default_factory=list)  # lane, class, ZCARD
    clock: int = 0
    now_ms: int = 0
    entries: list[tuple[str, str, float]] = field(default_factory=list)  # lane, job, ms
    tenants: list[tuple[str, str, int, list[str]]] = field(default_factory=list)
    records: int = 0
    queues: int = 0
    means: _Asked = field(default_factory=list)
    mean_fields: list[str] = field(default_factory=list)
    ready: list[_Ready] = field(default_factory=list)
    lengths: _Asked = field(default_factory=list)

    def ask_heads(self, reads: list[Cmd], deadlines: int, tenants: int) -> None:
        for lane, state in self.lanes.items():
            index = self.keys.lane_deadlines(lane)
            self.index[lane] = _place(reads, cmd("zcard", index))
            _place(reads, cmd("zrange", index, 0, deadlines - 1, withscores=True))
            outside = self.batch.get(lane, frozenset())
            for cls, n in state.waiting.items():
                if n > 0 and cls not in outside:
                    fair = self.keys.class_key(lane, cls, "fair")
                    self.fair.append((lane, cls, _place(reads, cmd("zcard", fair))))
                    _place(reads, cmd("zrange", fair, 0, tenants - 1))
        self.clock = _place(reads, server_time(self.keys.stats))

    def read_heads(self, replies: list[Any]) -> None:
        self.now_ms = field_int(replies[self.clock], 0)
        for lane, at in self.index.items():
            head = [(field_text(m), float(score)) for m, score in replies[at + 1]]
            self.entries += [(lane, job, ms) for job, ms in head]
            self.out[lane].unread += max(0, field_int(replies[at], 0) - len(head))
        for lane, cls, at in self.fair:
            names = [field_text(t) for t in replies[at + 1]]
            self.tenants.append((lane, cls, field_int(replies[at], 0), names))

    def ask_records(self, reads: list[Cmd]) -> None:
        fields = job_fields(_RECORD)
        self.records = len(reads)
        reads += [cmd("hmget", self.keys.job(job), fields) for _, job, _ in self.entries]
        self.queues = len(reads)
        for lane, cls, _, names in self.tenants:
            reads += [cmd("zcard", self.keys.tenant_queue(lane, cls, t)) for t in names]
        self.mean_fields = [
            class_field(lane, cls)
            for lane, state in self.lanes.items()
            for cls in sorted({*state.in_flight, *state.waiting})
        ]
        for lane, cls, _, names in self.tenants:
            self.mean_fields += [tenant_field(lane, cls, t) for t in names]
        self.means = _ask_learned(reads, self.keys, self.mean_fields)

    def read_records(self, replies: list[Any]) -> None:
        means = _read_learned(replies, self.means)
        self._queued(replies, means)
        self._running(means)
        for i, (lane, job, deadline) in enumerate(self.entries):
            record = from_values(job, _RECORD, replies[self.records + i])
            if record is None or record.status != "queued" or record.paused_under:
                continue  # not waiting for a slot (or gone)
            left = (deadline - self.now_ms) / 1000
            slots = max(1, record.slots)
            self.ready.append(
                _Ready(lane, record.service_class, left, slots, record.task, record.tenant)
            )

    def _queued(self, replies: list[Any], means: Mapping[str, float]) -> None:
        at = self.queues
        for lane, cls, active, names in self.tenants:
            fallback = means.get(class_field(lane, cls))
            parts = self.out[lane].queued.setdefault(cls, [])
            read = 0
            for name in names:
                jobs = field_int(replies[at], 0)
                at += 1
                read += jobs
                mean = means.get(tenant_field(lane, cls, name), fallback)
                parts.append(Queued(jobs, _seconds(mean)))
            if active > len(names):  # the rest of the class's waiting slots, at its mean
                rest = max(0, self.lanes[lane].waiting.get(cls, 0) - read)
                parts.append(Queued(rest, _seconds(fallback)))

    def _running(self, means: Mapping[str, float]) -> None:
        for lane, state in self.lanes.items():
            for cls, n in state.in_flight.items():
                if n > 0:
                    # a slot's job is on average halfway through its learned length
                    half = _seconds(means.get(class_field(lane, cls)), 0.5)
                    self.out[lane].running.setdefault(cls, []).append(Running(n, half))

    def ask_lengths(self, reads: list[Cmd]) -> None:
        fields = sorted({f for job in self.ready for f in job.fields()})
        self.lengths = _ask_learned(reads, self.keys, fields)

    def read_lengths(self, replies: list[Any]) -> None:
        means = _read_learned(replies, self.lengths)
        for job in self.ready:
            found = DeadlineJob(job.left_s, job.length_s(means), job.slots)
            self.out[job.lane].deadlines.append((job.cls, found))


def _seconds(ms: float | None, part: float = 1.0) -> float | None:
    return None if ms is None else ms * part / 1000
