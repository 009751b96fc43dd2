"""Finding jobs for the dashboard: the listing with its filters, one job, its run.

Jobs are found through the indexes the store already keeps, one per state, never by
scanning every key (``fairlane.store.views.jobs``, which names the index of each
state): each index is read up to ``PER_INDEX`` ids, so a listing is bounded whatever
the backlog, and the answer says when a bound was reached (``truncated``). A job's
state is always its record's, read afresh.

An app split into scheduling shards (``App(shards=n)``) has these indexes in every
shard: each shard's are read (``PER_INDEX`` ids each, so a listing reads at most ``n``
times as many) and the jobs merged; a job's record is read in the shard whose index
named it, and one job's page in the shard its id names (``App.store_for_job``).

A job's page that has not started yet also reads its start estimate (one call more:
``fairlane.app.startestimate``) and says it in a line, or why nothing can be said.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from fairlane.app import App
from fairlane.app.job import TERMINAL
from fairlane.app.startestimate import start_estimate
from fairlane.app.workflows import Workflow
from fairlane.gateway.startview import estimate_view
from fairlane.gateway.ui.queries import lanes_of, task_names
from fairlane.insight.explain import explain, rate_keys_now
from fairlane.insight.globalkeys import global_key_row
from fairlane.insight.runview import run_view
from fairlane.insight.startestimate import start_text
from fairlane.store.api import Store
from fairlane.store.fields import field_text
from fairlane.store.records import JobRecord
from fairlane.store.views.globalkeys import job_global_keys
from fairlane.store.views.jobs import PER_INDEX, STATES, Filter, candidates, listing
from fairlane.store.views.rates import job_rates
from fairlane.store.views.starts import class_starts

__all__ = ["PER_INDEX", "STATES", "Filter", "find_jobs", "job_detail"]

_VALUE_WIDTH = 2000


def _error(record: JobRecord) -> str | None:
    failure = record.failure
    return None if failure is None else f"{failure.type}: {failure.message}"[:300]


def _row(record: JobRecord, dead: bool) -> dict[str, Any]:
    return {
        "id": record.id,
        "task": record.task,
        "tenant": record.tenant,
        "lane": record.lane,
        "class": record.service_class,
        "status": record.status,
        "state": "dead" if dead and record.status == "failed" else record.status,
        "waiting_for": record.waiting_for or None,
        "attempts": record.attempts,
        "max_attempts": record.max_attempts,
        "enqueued_ms": record.enqueued_ms,
        "started_ms": record.started_ms,
        "finished_ms": record.finished_ms,
        "error": _error(record),
    }


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
    classes = {
        lane: [c for c in app.lane_classes(lane).names if flt.cls in (None, c)]
        for lane in lanes_of(app)
    }
    tasks = [flt.task] if flt.task else await task_names(app)
    found = await app.store.view(candidates, flt, classes, tasks)
    rows = [_row(record, dead) for record, dead in await app.store.view(listing, found.ids)]
    rows = [r for r in rows if _matches(r, flt)]
    rows.sort(key=lambda r: (r["enqueued_ms"] or 0, r["id"]), reverse=True)
    return {
        "jobs": rows[:limit],
        "matched": len(rows),
        "truncated": found.truncated,
        "per_index": PER_INDEX,
    }


def _value(raw: bytes) -> Any:
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
    record = await store.read_job(job_id)
    if record is None:
        return None
    events = await store.job_events(job_id)
    now = await store.server_time_ms()
    rates = await store.read(job_rates(store.keys, job_id))
    names = [*record.limits, *rates.rates, *rates.adaptive]
    shared = await store.view(job_global_keys, store.shard, names)
    pauses = await store.pause_entries()
    starts = await store.read(class_starts(store.keys, record.lane, record.service_class))
    why = explain(
        record,
        events,
        now_ms=now,
        rates=rates,
        global_keys=shared,
        pauses=pauses,
        starts=starts,
    )
    row = _row(record, await store.is_dead_letter(job_id))
    detail: dict[str, Any] = {
        **row,
        "priority": record.priority,
        "fairness_key": record.fairness_key or None,
        "worker": record.worker or None,
        "args": _value(record.args),
        "result": _value(record.result),
        "error_full": _error(record),
        "now_ms": now,
        "events": [{"ms": e.ms, "kind": e.kind, "detail": _plain(e.detail)} for e in events],
        "explanation": {
            "summary": why.summary,
            "waited_ms": why.waited_ms,
            "ran_ms": why.ran_ms,
            "segments": [asdict(s) | {"ms": s.ms} for s in why.segments],
        },
        "rate_keys": rate_keys_now(rates),
        "pushbacks": rates.pushbacks,
        "global_keys": [global_key_row(v) for v in shared.keys.values()],
        "start_estimate": await _start(store, record),
        "run": None,
    }
    if isinstance(app.tasks.get(record.task), Workflow) or record.run_started:
        history = await store.runs.history(job_id)
        detail["run"] = asdict(run_view(job_id, record, history, now))
    return detail


async def _start(store: Store, record: JobRecord) -> dict[str, Any] | None:
    """A job's start estimate as the page shows it; None once it has started."""
    if record.status in TERMINAL or record.status == "running":
        return None
    est = start_estimate(await store.estimate_job(record.id))
    at_ms = None if est.at is None else round(est.at.timestamp() * 1000)
    return {"at_ms": at_ms, "line": start_text(est), **estimate_view(est).model_dump()}


def _plain(value: Any) -> Any:
    """Event details as JSON can carry them (msgpack may hold bytes)."""
    if isinstance(value, bytes):
        return field_text(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
