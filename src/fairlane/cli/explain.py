"""``fairlane explain MODULE:APP JOB_ID``: where a job's time went, and why.

Reads the job's record and its lifecycle events (``ev:<id>``, kept with the record
and removed with it by retention) and prints one summary sentence, then the segments
of its life and why each wait happened: its class's capacity borrowed by other
classes (named), fair dispatch sharing its class with other tenants, a throttle key
(named: parked in its tenant's group on the key, then woken by it fairly by tenant and
back in its queue with an offer), a deferral by admission (and its reason), a retry
backoff (and the error), a scheduled start, a suspended workflow, an operator's pause
(paused by an operator at a time, for a reason, by whom and until when), a rate key (named
with its rate; while the job still waits on it, when its next tokens are due and a
pause with its cause), a pushback (``Throttled``: the key paused for everyone, the
attempt given back), or just a free worker slot -- and, where other jobs' retries took a
good part of its class's starts meanwhile (a retry storm), how many and what share. An
attempt whose task reported its time in model and tool calls (``report_usage``) is told
how much of its run that was. A job still parked on a key its app's
shards share (a global key) is told the part of the key its shard holds, its use and
waiters there, and what the other shards hold. The job's rate keys are listed with
their state now. ``--json`` prints
the same as JSON, with the timeline it was read from: the events the store logged and
those rebuilt from the record (``"derived": true``), and the job's global keys with
each shard's part.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from fairlane.app import App
from fairlane.cli._common import AppSpec, JobId, RedisUrl, console, fail, load_app, run
from fairlane.insight.explain import explain as explain_record
from fairlane.insight.explain import format_ms, rate_keys_now
from fairlane.insight.globalkeys import global_key_row
from fairlane.insight.startestimate import StartEstimate, start_estimate
from fairlane.store.pausing import PauseEntry
from fairlane.store.records import Event, JobRecord
from fairlane.store.views.globalkeys import JobGlobalKeys, job_global_keys
from fairlane.store.views.rates import JobRates, job_rates
from fairlane.store.views.starts import ClassStarts, class_starts

__all__ = ["explain"]


@dataclass(frozen=True, slots=True)
class _Read:
    record: JobRecord | None
    events: list[Event]
    now_ms: int
    rates: JobRates
    shared: JobGlobalKeys
    pauses: list[PauseEntry]
    starts: ClassStarts | None
    start: StartEstimate | None


async def _load(app: App, job_id: str) -> _Read:
    async with app:
        store = app.store_for_job(job_id)
        record = await store.read_job(job_id)
        events = await store.job_events(job_id)
        rates = await store.read(job_rates(store.keys, job_id))
        names = [*(record.limits if record else ()), *rates.rates, *rates.adaptive]
        shared = await store.view(job_global_keys, store.shard, names)
        pauses = await store.pause_entries()
        starts = (
            await store.read(class_starts(store.keys, record.lane, record.service_class))
            if record is not None
            else None
        )
        start = None
        if record is not None and record.status in ("queued", "scheduled"):
            start = start_estimate(await store.estimate_job(job_id))
        now = await store.server_time_ms()
        return _Read(record, events, now, rates, shared, pauses, starts, start)


def _at(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]


def _plain(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _rate_lines(rates: JobRates) -> list[str]:
    lines = [row["text"] for row in rate_keys_now(rates)]
    if rates.pushbacks:
        lines.append(f"pushbacks taken without spending an attempt: {rates.pushbacks}")
    return lines


def explain(
    app_spec: AppSpec,
    job_id: JobId,
    as_json: Annotated[bool, typer.Option("--json", help="Print the explanation as JSON.")] = False,
    redis_url: RedisUrl = None,
) -> None:
    """Explain a job: where its time went (waiting, and why; running, and where) in one answer."""
    app = load_app(app_spec, redis_url)
    read = run(_load(app, job_id))
    record, events, rates, shared = read.record, read.events, read.rates, read.shared
    if record is None and not events:
        fail(
            f"no record of job {job_id} in app {app.name!r} (never enqueued, or removed by "
            "retention)"
        )
    answer = explain_record(
        record or JobRecord(job_id),
        events,
        now_ms=read.now_ms,
        rates=rates,
        global_keys=shared,
        pauses=read.pauses,
        starts=read.starts,
        start=read.start,
    )
    if as_json:
        out = {
            "id": job_id,
            **{k: v for k, v in asdict(answer).items() if k != "events"},
            "events": [
                {
                    "ms": e.ms,
                    "kind": e.kind,
                    "detail": {k: _plain(v) for k, v in e.detail.items()},
                    "derived": e.derived,
                }
                for e in answer.events
            ],
            "rate_keys": rate_keys_now(rates),
            "pushbacks": rates.pushbacks,
            "global_keys": [global_key_row(v) for v in shared.keys.values()],
            "estimated_start": answer.estimated_start.isoformat()
            if answer.estimated_start
            else None,
        }
        typer.echo(json.dumps(out, indent=2, ensure_ascii=False))
        return
    out_console = console()
    whose = f", fairness key {escape(answer.fairness_key)}" if answer.fairness_key else ""
    out_console.print(f"[bold]job {escape(job_id)}[/] ({escape(answer.status or '?')}){whose}")
    out_console.print(escape(answer.summary))
    for line in _rate_lines(rates):
        out_console.print(escape(line))
    if not answer.segments:
        return
    table = Table(box=None, pad_edge=False)
    table.add_column("from")
    table.add_column("for", justify="right")
    table.add_column("what", style="bold")
    table.add_column("why", overflow="fold")
    for s in answer.segments:
        took = format_ms(s.ms) + (" +" if s.open else "")
        table.add_row(_at(s.from_ms), took, s.what, escape(s.why))
    out_console.print(table)
