"""Finding jobs: through the indexes the store keeps, and their records in one pipeline.

Jobs are found through the indexes the store already keeps (``fairlane/store/keys.py``),
one per state, never by scanning every key:

=============  ==============================================================
state          index read
=============  ==============================================================
queued         each active tenant's queue ``q:<l>:<c>:<t>`` (a job a throttle key
               woke is back in it, with offers: its record's ``toff``)
scheduled      ``lane:<l>:delayed`` (delays, retry backoff, suspended runs)
deferred       ``lane:<l>:c:<c>:deferred``
throttled      ``thr:wait`` (jobs parked on a full throttle key)
running        ``leases``
completed      ``kept:<task>:ok`` (newest first)
failed         ``kept:<task>:failed`` (also cancelled and expired), ``dead``
=============  ==============================================================

Each index is read up to ``PER_INDEX`` ids (newest first where the index is ordered by
time), so a search is bounded whatever the backlog; it says when a bound was reached
(``truncated``). A job's state is always its record's, read afresh. An app split into
scheduling shards has these indexes in every shard: each shard's are read and the jobs
merged, each record read in the shard whose index named it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fairlane.store.fields import field_text
from fairlane.store.keys import AppKeys
from fairlane.store.reads import Cmd, Plan, cmd
from fairlane.store.records import LISTING, JobAttr, JobRecord, from_values, job_fields

__all__ = ["PER_INDEX", "STATES", "Filter", "Found", "candidates", "listing", "read_jobs"]

PER_INDEX = 1000
STATES = (
    "queued",
    "scheduled",
    "deferred",
    "throttled",
    "running",
    "completed",
    "failed",
    "cancelled",
    "expired",
    "dead",
)


@dataclass(frozen=True, slots=True)
class Filter:
    """Which jobs: any of ``states`` (all when empty), and tenant, class and task if given."""

    states: frozenset[str] = frozenset()
    tenant: str | None = None
    cls: str | None = None
    task: str | None = None

    def __post_init__(self) -> None:
        unknown = self.states - set(STATES)
        if unknown:
            raise ValueError(f"unknown states {sorted(unknown)}; known: {', '.join(STATES)}")

    def wants(self, state: str) -> bool:
        return not self.states or state in self.states


@dataclass
class Found:
    """Job ids the indexes named, each with the shard whose index named it first."""

    ids: dict[str, int] = field(default_factory=dict)
    truncated: bool = False

    def add(self, shard: int, batch: Iterable[Any]) -> None:
        got = [field_text(i) for i in batch]
        self.truncated |= len(got) >= PER_INDEX
        for job_id in got:
            self.ids.setdefault(job_id, shard)


def _fixed_indexes(
    keys: AppKeys, flt: Filter, classes: Mapping[str, Sequence[str]], tasks: Sequence[str]
) -> list[Cmd]:
    """Reads of one shard's indexes whose names are known before any read."""
    out: list[Cmd] = []
    for lane, names in classes.items():
        if flt.wants("scheduled"):
            out.append(cmd("zrange", keys.lane(lane).delayed, 0, PER_INDEX - 1))
        if flt.wants("deferred"):
            deferred = (keys.class_key(lane, cls, "deferred") for cls in names)
            out += [cmd("zrange", key, 0, PER_INDEX - 1) for key in deferred]
    if flt.wants("running"):
        out.append(cmd("zrange", keys.leases, 0, PER_INDEX - 1))
    if flt.wants("dead") or flt.wants("failed"):
        out.append(cmd("zrevrange", keys.dead, 0, PER_INDEX - 1))
    for task in tasks:
        if flt.wants("completed"):
            out.append(cmd("zrevrange", keys.kept(task, "ok"), 0, PER_INDEX - 1))
        if flt.states & {"failed", "cancelled", "expired"} or not flt.states:
            out.append(cmd("zrevrange", keys.kept(task, "failed"), 0, PER_INDEX - 1))
    return out


def candidates(
    keys: Sequence[AppKeys],
    flt: Filter,
    classes: Mapping[str, Sequence[str]],
    tasks: Sequence[str],
) -> Plan[Found]:
    """The ids the indexes of ``flt``'s states name, over every shard: ``classes`` the
    classes to look in per lane, ``tasks`` the tasks whose retention indexes to read."""
    pairs = [(lane, cls) for lane, names in classes.items() for cls in names]
    # the shard each read is for, and whether it reads throttle waiters
    # ('<key>\0<order>\0<job id>') rather than job ids
    reads: list[tuple[int, bool]] = []
    batch: list[Cmd] = []
    if flt.wants("queued"):
        fair = [
            cmd("zrange", k.class_key(lane, cls, "fair"), 0, -1)
            for k in keys
            for lane, cls in pairs
        ]
        tenants = iter((yield fair))
        for shard, k in enumerate(keys):
            for lane, cls in pairs:
                for tenant in map(field_text, next(tenants)):
                    if flt.tenant in (None, tenant):
                        batch.append(
                            cmd("zrange", k.tenant_queue(lane, cls, tenant), 0, PER_INDEX - 1)
                        )
                        reads.append((shard, False))
    for shard, k in enumerate(keys):
        fixed = _fixed_indexes(k, flt, classes, tasks)
        batch += fixed
        reads += [(shard, False)] * len(fixed)
        if flt.wants("throttled"):
            batch.append(cmd("zrange", k.throttle_waiters, 0, PER_INDEX - 1))
            reads.append((shard, True))
    found = Found()
    for (shard, waiters), got in zip(reads, (yield batch), strict=True):
        found.add(shard, (field_text(m).rpartition("\0")[2] for m in got) if waiters else got)
    return found


def read_jobs(
    keys: Sequence[AppKeys], jobs: Iterable[tuple[str, int]], only: Sequence[JobAttr]
) -> Plan[list[JobRecord | None]]:
    """The attributes ``only`` of each (job id, shard), None where a job has no record."""
    wanted = list(jobs)
    fields = job_fields(only)
    reply = yield [cmd("hmget", keys[shard].job(job_id), fields) for job_id, shard in wanted]
    return [
        from_values(job_id, only, values) for (job_id, _), values in zip(wanted, reply, strict=True)
    ]


def listing(keys: Sequence[AppKeys], ids: Mapping[str, int]) -> Plan[list[tuple[JobRecord, bool]]]:
    """The listing records of ``ids`` (job id -> its shard) with whether each is a dead
    letter, in the order given; a record retention removed meanwhile is left out."""
    fields = job_fields(LISTING)
    batch = []
    for job_id, shard in ids.items():
        batch += [
            cmd("hmget", keys[shard].job(job_id), fields),
            cmd("zscore", keys[shard].dead, job_id),
        ]
    reply = yield batch
    rows = []
    for n, job_id in enumerate(ids):
        record = from_values(job_id, LISTING, reply[2 * n])
        if record is not None and record.status:
            rows.append((record, reply[2 * n + 1] is not None))
    return rows
