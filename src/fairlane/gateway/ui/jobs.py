"""Finding jobs for the dashboard: the listing with its filters, one job, its run.

Jobs are found through the indexes the store already keeps (``fairlane/store/keys.py``),
one per state, never by scanning every key:

=============  ==============================================================
state          index read
=============  ==============================================================
queued         each active tenant's queue ``q:<l>:<c>:<t>`` and ``granted``
scheduled      ``lane:<l>:delayed`` (delays, retry backoff, suspended runs)
deferred       ``lane:<l>:c:<c>:deferred``
throttled      ``thr:wait`` (jobs parked on a full throttle key)
running        ``leases``
completed      ``kept:<task>:ok`` (newest first)
failed         ``kept:<task>:failed`` (also cancelled and expired), ``dead``
=============  ==============================================================

Each index is read up to ``PER_INDEX`` ids (newest first where the index is ordered
by time), so a listing is bounded whatever the backlog; the answer says when a bound
was reached (``truncated``). A job's state is always its record's, read afresh.

An app split into scheduling shards (``App(shards=n)``) has these indexes in every
shard: each shard's are read (``PER_INDEX`` ids each, so a listing reads at most
``n`` times as many) and the jobs merged; a job's record is read in the shard whose
index named it, and one job's page in the shard its id names (``App.store_for_job``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from fairlane.app import App
from fairlane.codec import decode_error
from fairlane.gateway.ui.queries import execute, lanes_of, task_names
from fairlane.store.explain import explain
from fairlane.store.fields import field_text
from fairlane.store.keys import AppKeys
from fairlane.store.runview import run_view
from fairlane.workflows import Workflow

__all__ = ["PER_INDEX", "STATES", "Filter", "find_jobs", "job_detail"]

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
_FIELDS = ("task", "tenant", "lane", "cls", "st", "att", "max", "enq", "start", "fin", "err", "wf")
_VALUE_WIDTH = 2000


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
class _Found:
    ids: dict[str, int] = field(default_factory=dict)  # job id -> the shard that named it
    truncated: bool = False

    def add(self, shard: int, batch: Iterable[Any]) -> None:
        got = [field_text(i) for i in batch]
        self.truncated |= len(got) >= PER_INDEX
        for job_id in got:
            self.ids.setdefault(job_id, shard)


def _fixed_indexes(
    keys: AppKeys, flt: Filter, classes: dict[str, list[str]], tasks: list[str]
) -> list[tuple[str, bool]]:
    """One shard's indexes whose names are known before any read: (key, newest first)."""
    out: list[tuple[str, bool]] = []
    for lane, names in classes.items():
        if flt.wants("scheduled"):
            out.append((keys.lane(lane).delayed, False))
        if flt.wants("deferred"):
            out += [(keys.class_key(lane, cls, "deferred"), False) for cls in names]
    if flt.wants("running"):
        out.append((keys.leases, False))
    if flt.wants("dead") or flt.wants("failed"):
        out.append((keys.dead, True))
    for task in tasks:
        if flt.wants("completed"):
            out.append((keys.kept(task, "ok"), True))
        if flt.states & {"failed", "cancelled", "expired"} or not flt.states:
            out.append((keys.kept(task, "failed"), True))
    return out


async def _candidates(app: App, flt: Filter) -> _Found:
    client = app.store.client
    found = _Found()
    classes = {
        lane: [c for c in app.lane_classes(lane).names if flt.cls in (None, c)]
        for lane in lanes_of(app)
    }
    pairs = [(lane, cls) for lane, names in classes.items() for cls in names]
    tasks = [flt.task] if flt.task else await task_names(app)
    # the shard each read of the last pipeline is for, in order, and whether it reads
    # throttle waiters ('<key>\0<order>\0<job id>') rather than job ids
    reads: list[tuple[int, bool]] = []
    pipe = client.pipeline(transaction=False)
    if flt.wants("queued"):
        for store in app.stores:
            for lane, cls in pairs:
                pipe.zrange(store.keys.class_key(lane, cls, "fair"), 0, -1)
        tenants = iter(await execute(pipe))
        pipe = client.pipeline(transaction=False)
        for shard, store in enumerate(app.stores):
            for lane, cls in pairs:
                for tenant in next(tenants):
                    if flt.tenant in (None, field_text(tenant)):
                        queue = store.keys.tenant_queue(lane, cls, field_text(tenant))
                        pipe.zrange(queue, 0, PER_INDEX - 1)
                        reads.append((shard, False))
                pipe.zrange(store.keys.class_key(lane, cls, "granted"), 0, PER_INDEX - 1)
                reads.append((shard, False))
    for shard, store in enumerate(app.stores):
        for key, newest_first in _fixed_indexes(store.keys, flt, classes, tasks):
            read = pipe.zrevrange if newest_first else pipe.zrange
            read(key, 0, PER_INDEX - 1)
            reads.append((shard, False))
        if flt.wants("throttled"):
            pipe.zrange(store.keys.throttle_waiters, 0, PER_INDEX - 1)
            reads.append((shard, True))
    for (shard, waiters), batch in zip(reads, await execute(pipe), strict=True):
        found.add(shard, (field_text(m).rpartition("\0")[2] for m in batch) if waiters else batch)
    return found


def _error(raw: bytes | None) -> str | None:
    if not raw:
        return None
    try:
        info = decode_error(raw)
    except Exception:  # a malformed record is still shown, raw
        return field_text(raw)[:300]
    return f"{info.type}: {info.message}"[:300]


def _row(job_id: str, values: list[Any], dead: bool) -> dict[str, Any]:
    rec = dict(zip(_FIELDS, values, strict=True))

    def num(name: str) -> int | None:
        raw = rec.get(name)
        return int(raw) if raw else None

    status = field_text(rec["st"])
    return {
        "id": job_id,
        "task": field_text(rec["task"]),
        "tenant": field_text(rec["tenant"]),
        "lane": field_text(rec["lane"]),
        "class": field_text(rec["cls"]) or "standard",
        "status": status,
        "state": "dead" if dead and status == "failed" else status,
        "waiting_for": field_text(rec["wf"]) or None,
        "attempts": num("att") or 0,
        "max_attempts": num("max"),
        "enqueued_ms": num("enq"),
        "started_ms": num("start"),
        "finished_ms": num("fin"),
        "error": _error(rec.get("err")),
    }


async def _rows(app: App, ids: dict[str, int]) -> list[dict[str, Any]]:
    """Listing rows of ``ids`` (job id -> its shard), each read in its shard."""
    pipe = app.store.client.pipeline(transaction=False)
    for job_id, shard in ids.items():
        keys = app.stores[shard].keys
        pipe.hmget(keys.job(job_id), *_FIELDS)
        pipe.zscore(keys.dead, job_id)
    reply = await execute(pipe) if ids else []
    rows = []
    for n, job_id in enumerate(ids):
        values, dead = reply[2 * n], reply[2 * n + 1]
        if values[_FIELDS.index("st")] is not None:  # a record retention removed meanwhile
            rows.append(_row(job_id, values, dead is not None))
    return rows


def _matches(row: dict[str, Any], flt: Filter) -> bool:
    if flt.states and row["status"] not in flt.states and row["state"] not in flt.states:
        return False
    if flt.states == {"dead"} and row["state"] != "dead":
        return False
    return (
        flt.tenant in (None, row["tenant"])
        and flt.cls in (None, row["class"])
        and flt.task in (None, row["task"])
    )


async def find_jobs(app: App, flt: Filter, limit: int) -> dict[str, Any]:
    """Jobs matching ``flt``, newest first, at most ``limit``; ``matched`` counts all the
    indexes gave (bounded by ``PER_INDEX`` per index, ``truncated`` when a bound hit)."""
    found = await _candidates(app, flt)
    rows = [r for r in await _rows(app, found.ids) if _matches(r, flt)]
    rows.sort(key=lambda r: (r["enqueued_ms"] or 0, r["id"]), reverse=True)
    return {
        "jobs": rows[:limit],
        "matched": len(rows),
        "truncated": found.truncated,
        "per_index": PER_INDEX,
    }


def _value(raw: bytes | None) -> Any:
    if not raw:
        return None
    shown = field_text(raw)
    if len(shown) > _VALUE_WIDTH:
        return shown[:_VALUE_WIDTH] + "..."
    try:
        return json.loads(shown)
    except ValueError:
        return shown


async def job_detail(app: App, job_id: str) -> dict[str, Any] | None:
    """One job: its record, its lifecycle events, the explanation, and its run if it is one."""
    store = app.store_for_job(job_id)
    record = await store.job_record(job_id)
    if not record:
        return None
    events = await store.job_events(job_id)
    now = await store.server_time_ms()
    why = explain(record, events, now_ms=now)
    dead = await store.client.zscore(store.keys.dead, job_id)
    row = _row(job_id, [record.get(f) for f in _FIELDS], dead is not None)
    detail: dict[str, Any] = {
        **row,
        "priority": int(record.get("prio", b"0") or 0),
        "worker": field_text(record.get("wk")) or None,
        "args": _value(record.get("args")),
        "result": _value(record.get("res")),
        "error_full": _error(record.get("err")) if record.get("err") else None,
        "now_ms": now,
        "events": [{"ms": e.ms, "kind": e.kind, "detail": _plain(e.detail)} for e in events],
        "explanation": {
            "summary": why.summary,
            "waited_ms": why.waited_ms,
            "ran_ms": why.ran_ms,
            "segments": [asdict(s) | {"ms": s.ms} for s in why.segments],
        },
        "run": None,
    }
    task = app.tasks.get(row["task"])
    if isinstance(task, Workflow) or record.get("wfr"):
        history = await store.runs.history(job_id)
        detail["run"] = asdict(run_view(job_id, record, history, now))
    return detail


def _plain(value: Any) -> Any:
    """Event details as JSON can carry them (msgpack may hold bytes)."""
    if isinstance(value, bytes):
        return field_text(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
