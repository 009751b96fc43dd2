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
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from fairlane.app import App
from fairlane.codec import decode_error
from fairlane.explain import explain
from fairlane.gateway.ui.queries import execute, lanes_of, server_ms, task_names, text
from fairlane.runview import run_view
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
    ids: dict[str, None] = field(default_factory=dict)
    truncated: bool = False

    def add(self, batch: Iterable[Any]) -> None:
        got = [text(i) for i in batch]
        self.truncated |= len(got) >= PER_INDEX
        self.ids.update(dict.fromkeys(got))


async def _candidates(app: App, flt: Filter) -> _Found:  # noqa: C901, PLR0912 - one branch per index
    store, keys = app.store, app.store.keys
    client = store.client
    found = _Found()
    lanes = lanes_of(app)
    classes = {
        lane: [c for c in app.lane_classes(lane).names if flt.cls in (None, c)] for lane in lanes
    }
    pipe = client.pipeline(transaction=False)
    if flt.wants("queued"):
        for lane in lanes:
            for cls in classes[lane]:
                pipe.zrange(keys.class_key(lane, cls, "fair"), 0, -1)
        tenants = await execute(pipe)
        pipe = client.pipeline(transaction=False)
        i = 0
        for lane in lanes:
            for cls in classes[lane]:
                for tenant in tenants[i]:
                    if flt.tenant in (None, text(tenant)):
                        pipe.zrange(keys.tenant_queue(lane, cls, text(tenant)), 0, PER_INDEX - 1)
                pipe.zrange(keys.class_key(lane, cls, "granted"), 0, PER_INDEX - 1)
                i += 1
    for lane in lanes:
        if flt.wants("scheduled"):
            pipe.zrange(keys.lane(lane).delayed, 0, PER_INDEX - 1)
        if flt.wants("deferred"):
            for cls in classes[lane]:
                pipe.zrange(keys.class_key(lane, cls, "deferred"), 0, PER_INDEX - 1)
    if flt.wants("running"):
        pipe.zrange(keys.leases, 0, PER_INDEX - 1)
    if flt.wants("dead") or flt.wants("failed"):
        pipe.zrevrange(keys.dead, 0, PER_INDEX - 1)
    tasks = [flt.task] if flt.task else await task_names(app)
    for task in tasks:
        if flt.wants("completed"):
            pipe.zrevrange(keys.kept(task, "ok"), 0, PER_INDEX - 1)
        if flt.states & {"failed", "cancelled", "expired"} or not flt.states:
            pipe.zrevrange(keys.kept(task, "failed"), 0, PER_INDEX - 1)
    for batch in await execute(pipe):
        found.add(batch)
    if flt.wants("throttled"):
        members = await client.zrange(keys.throttle_waiters, 0, PER_INDEX - 1)
        found.add(text(m).rpartition("\0")[2] for m in members)
    return found


def _error(raw: bytes | None) -> str | None:
    if not raw:
        return None
    try:
        info = decode_error(raw)
    except Exception:  # a malformed record is still shown, raw
        return text(raw)[:300]
    return f"{info.type}: {info.message}"[:300]


def _row(job_id: str, values: list[Any], dead: bool) -> dict[str, Any]:
    rec = dict(zip(_FIELDS, values, strict=True))

    def num(name: str) -> int | None:
        raw = rec.get(name)
        return int(raw) if raw else None

    status = text(rec["st"])
    return {
        "id": job_id,
        "task": text(rec["task"]),
        "tenant": text(rec["tenant"]),
        "lane": text(rec["lane"]),
        "class": text(rec["cls"]) or "standard",
        "status": status,
        "state": "dead" if dead and status == "failed" else status,
        "waiting_for": text(rec["wf"]) or None,
        "attempts": num("att") or 0,
        "max_attempts": num("max"),
        "enqueued_ms": num("enq"),
        "started_ms": num("start"),
        "finished_ms": num("fin"),
        "error": _error(rec.get("err")),
    }


async def _rows(app: App, ids: list[str]) -> list[dict[str, Any]]:
    store = app.store
    pipe = store.client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(store.keys.job(job_id), *_FIELDS)
        pipe.zscore(store.keys.dead, job_id)
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
    rows = [r for r in await _rows(app, list(found.ids)) if _matches(r, flt)]
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
    shown = text(raw)
    if len(shown) > _VALUE_WIDTH:
        return shown[:_VALUE_WIDTH] + "..."
    try:
        return json.loads(shown)
    except ValueError:
        return shown


async def job_detail(app: App, job_id: str) -> dict[str, Any] | None:
    """One job: its record, its lifecycle events, the explanation, and its run if it is one."""
    record = await app.store.job_record(job_id)
    if not record:
        return None
    events = await app.store.job_events(job_id)
    now = await server_ms(app)
    why = explain(record, events, now_ms=now)
    dead = await app.store.client.zscore(app.store.keys.dead, job_id)
    row = _row(job_id, [record.get(f) for f in _FIELDS], dead is not None)
    detail: dict[str, Any] = {
        **row,
        "priority": int(record.get("prio", b"0") or 0),
        "worker": text(record.get("wk")) or None,
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
        history = await app.store.runs.history(job_id)
        detail["run"] = asdict(run_view(job_id, record, history, now))
    return detail


def _plain(value: Any) -> Any:
    """Event details as JSON can carry them (msgpack may hold bytes)."""
    if isinstance(value, bytes):
        return text(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
