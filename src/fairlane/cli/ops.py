"""Operating an app: ``purge``, ``inspect tasks|lanes``, ``dead list|redrive``, ``job ...``.

An app split into scheduling shards is operated as one: ``purge`` counts and deletes
the keys of every shard, the dead letters are every shard's, and a job is read or
cancelled in the shard its id names (``App.store_for_job``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from cronsim import CronSim
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from fairlane.app import App
from fairlane.cli._common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    AppSpec,
    JobId,
    RedisUrl,
    console,
    fail,
    load_app,
    run,
)
from fairlane.config.lanes import LimitValue
from fairlane.config.settings import WorkerSettings
from fairlane.policy.rates import Adaptive, Rate
from fairlane.policy.retention import Keep
from fairlane.registry import TaskOptions
from fairlane.store.api import redact_url
from fairlane.store.fields import field_text
from fairlane.store.records import JobRecord

__all__ = ["dead_app", "inspect_app", "job_app", "purge"]

inspect_app = typer.Typer(help="Look at an app's declarations.", no_args_is_help=True)
dead_app = typer.Typer(help="Dead-lettered jobs: list them, send them back.", no_args_is_help=True)
job_app = typer.Typer(help="One job: its status, or cancel it.", no_args_is_help=True)

_ERROR_WIDTH = 80


# -- purge -----------------------------------------------------------------------------


async def _count_keys(app: App) -> tuple[str, int]:
    # not declared: the keys of any store layout are counted and purged alike
    await app.connect(declare=False)
    try:
        count = 0
        for store in app.stores:
            count += await store.count_keys()
        return app.url or "?", count
    finally:
        await app.aclose()


async def _purge(app: App) -> int:
    await app.connect(declare=False)
    try:
        return await app.purge()
    finally:
        await app.aclose()


def purge(
    app_spec: AppSpec,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    redis_url: RedisUrl = None,
) -> None:
    """Delete every key of MODULE:APP: queued and running jobs, results, dead letters, stats."""
    app = load_app(app_spec, redis_url)
    if not yes:
        url, count = run(_count_keys(app))
        typer.confirm(
            f"Delete all {count} keys of app {app.name!r} on {redact_url(url)}? "
            "Queued jobs are lost and running ones cannot report back",
            abort=True,
        )
    removed = run(_purge(app))
    console().print(f"purged app {app.name!r}: removed {removed} key(s)")


# -- inspect tasks -----------------------------------------------------------------------


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "none"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _keep(keep: Keep) -> str:
    parts = []
    if keep.count is not None:
        parts.append(f"{keep.count}")
    if keep.age is not None:
        parts.append(_duration(keep.age))
    return ", ".join(parts) if parts else "forever"


def _limit_text(limit: LimitValue) -> str:
    if isinstance(limit, Adaptive):
        return f"adaptive {limit.min}..{limit.max}"
    return str(limit)


def _limits(
    limits: tuple[tuple[str, LimitValue], ...], rates: tuple[tuple[str, Rate], ...], default: bool
) -> Text:
    parts = [f"{key} <= {_limit_text(limit)}" for key, limit in limits]
    parts += [f"{key} <= {r.limit:g}/{r.per:g}s ({r.cost})" for key, r in rates]
    return _cell(", ".join(parts) or "none", default)


def _cell(value: str, default: bool) -> Text:
    if default:
        return Text(f"{value} (default)", style="dim")
    return Text(value)


@inspect_app.command("tasks")
def inspect_tasks(app_spec: AppSpec) -> None:
    """One row per task, by the name producers store and workers look up, with its
    effective options (``gateway``: exposed to tenants over HTTP, or private); options
    left at their default are marked."""
    app = load_app(app_spec)
    concurrency = app.settings.worker.concurrency
    concurrency_default = concurrency == WorkerSettings.model_fields["concurrency"].default
    table = Table(title=f"tasks of app {app.name!r}", title_justify="left")
    # throttle limits are rare: their column is shown only when a task names some
    show_limits = any(task.options.limits or task.options.rates for task in app.tasks.values())
    # as rare: tasks that run jobs without stored arguments their function does not take
    show_drops = any(task.options.unknown_kwargs == "drop" for task in app.tasks.values())
    for column in (
        "name",
        "gateway",
        "lane",
        "class",
        "slots",
        *(["limits"] if show_limits else []),
        "executor",
        "attempts",
        "backoff",
        "timeout",
        "retention",
        "retry_on",
        *(["unknown kwargs"] if show_drops else []),
        "concurrency",
    ):
        table.add_column(column, overflow="fold", no_wrap=column == "name")
    in_use = _cell(f"{concurrency} per worker", concurrency_default)
    for name in sorted(app.tasks):
        options = app.tasks[name].options
        table.add_row(*_task_row(name, options, limits=show_limits, drops=show_drops), in_use)
    out = console()
    if app.tasks:
        out.print(table)
    else:
        out.print(f"app {app.name!r} has no tasks")
    if app.crons:
        _print_crons(app)


def _task_row(name: str, options: TaskOptions, *, limits: bool, drops: bool) -> list[Text]:
    """A task's cells but the last (the worker's concurrency); ``limits`` and ``drops``:
    whether those columns are shown."""
    defaults = options.defaults
    backoff = options.backoff
    return [
        Text(name),
        # a private task is the default: only the exposed ones say so
        Text("exposed") if options.gateway else _cell("private", True),
        _cell(options.lane, "lane" in defaults),
        _cell(options.service_class, "service_class" in defaults),
        _cell(str(options.slots), "slots" in defaults),
        *(
            [_limits(options.limits, options.rates, {"limits", "rates"} <= defaults)]
            if limits
            else []
        ),
        _cell(options.executor, "executor" in defaults),
        _cell(str(options.attempts), "attempts" in defaults),
        _cell(
            f"{_duration(backoff.base)}..{_duration(backoff.cap)} {backoff.jitter}",
            "backoff" in defaults,
        ),
        _cell(_duration(options.timeout), "timeout" in defaults),
        _cell(
            f"ok: {_keep(options.retention.completed)}; failed: {_keep(options.retention.failed)}",
            "retention" in defaults,
        ),
        _cell(", ".join(cls.__name__ for cls in options.retry_on), "retry_on" in defaults),
        *([_cell(options.unknown_kwargs, "unknown_kwargs" in defaults)] if drops else []),
    ]


@inspect_app.command("lanes")
def inspect_lanes(app_spec: AppSpec) -> None:
    """The service classes of every lane the app declares or its tasks use; a restricted
    class takes only the jobs of tenants entitled to it."""
    app = load_app(app_spec)
    lanes = list(dict.fromkeys([*app.lanes, *(t.options.lane for t in app.tasks.values())]))
    table = Table(title=f"lanes of app {app.name!r}", title_justify="left")
    columns = ("lane", "class", "share", "min slots", "lendable", "borrowable", "batch")
    for column in (*columns, "restricted"):
        table.add_column(column, overflow="fold")
    for lane in sorted(lanes):
        default = lane not in app.lanes
        for cls in app.lane_classes(lane):
            borrowable = "up to C" if cls.borrowable is None else f"{cls.borrowable:g}"
            table.add_row(
                _cell(lane, default),
                Text(cls.name),
                Text(f"{cls.nominal_share:g}"),
                Text(str(cls.min_slots)),
                Text(f"{cls.lendable:g}"),
                Text(borrowable),
                Text("yes" if cls.batch else "no"),
                # only tenants entitled to it may use it (app.tenants.configure(classes=...))
                Text("yes" if cls.restricted else "no"),
            )
    out = console()
    if lanes:
        out.print(table)
        out.print(_queue_bounds_table(app, sorted(lanes)))
    else:
        out.print(f"app {app.name!r} declares no lanes and has no tasks")


def _bound(n: int | None) -> str:
    return "none" if n is None else f"{n:,}"


def _queue_bounds_table(app: App, lanes: list[str]) -> Table:
    """How many jobs may wait in each lane: its pool's bounds, else the default ones
    (``queues`` settings; what counts is ``fairlane.policy.admission.bounds``)."""
    table = Table(title="queue bounds", title_justify="left")
    for column in ("lane", "per tenant", "per lane", "from"):
        table.add_column(column, overflow="fold")
    queues = app.settings.queues
    pools = app.registry.config.pools
    for lane in lanes:
        pool = pools.get(lane)
        if pool is None:
            table.add_row(
                lane,
                f"{_bound(queues.tenant_max_queued)} ready per class queue",
                f"{_bound(queues.lane_max_queued)} ready slots",
                "queues settings (lane without a pool)",
            )
            continue
        for item in pool.admission.classes:
            tenant = item.max_queue if item.tenant_max_queue is None else item.tenant_max_queue
            table.add_row(
                lane,
                f"{tenant:,} admitted in {item.name}",
                f"{item.max_queue:,} admitted in {item.name}",
                f"pool {lane} ({item.when_full} when full)",
            )
    return table


def _print_crons(app: App) -> None:
    table = Table(title="cron entries (UTC)", title_justify="left")
    for column in ("task", "schedule", "lane", "next run"):
        table.add_column(column, overflow="fold")
    now = datetime.now(UTC)
    for name in sorted(app.crons):
        entry = app.crons[name]
        upcoming: datetime = next(CronSim(entry.schedule, now))
        table.add_row(
            name, entry.schedule, entry.task.options.lane, upcoming.strftime("%Y-%m-%d %H:%M:%SZ")
        )
    console().print(table)


# -- dead letters -----------------------------------------------------------------------


def _when(epoch_seconds: float | None) -> str:
    if epoch_seconds is None:
        return "-"
    return datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _ms(ms: int | None) -> float | None:
    return ms / 1000 if ms is not None else None


def _error_text(record: JobRecord, width: int | None = _ERROR_WIDTH) -> str:
    failure = record.failure
    if failure is None:
        return "-"
    text = f"{failure.type}: {failure.message}"
    if width is not None and len(text) > width:
        text = text[: width - 3] + "..."
    return text


async def _dead_rows(app: App, limit: int) -> list[tuple[str, float, JobRecord | None]]:
    async with app:
        rows = []
        for job_id, died in await app.dead_letters(limit):
            rows.append((job_id, died, await app.store_for_job(job_id).read_job(job_id)))
        return rows


@dead_app.command("list")
def dead_list(
    app_spec: AppSpec,
    limit: Annotated[int, typer.Option(min=1, help="Most jobs to list, oldest first.")] = 100,
    redis_url: RedisUrl = None,
) -> None:
    """List dead-lettered jobs: id, task, tenant, attempts, when it died, its last error."""
    app = load_app(app_spec, redis_url)
    rows = run(_dead_rows(app, limit))
    out = console()
    if not rows:
        out.print(f"no dead-lettered jobs in app {app.name!r}")
        return
    table = Table(title=f"dead letters of app {app.name!r} (oldest first)", title_justify="left")
    for column in ("id", "task", "tenant", "attempts", "died at", "last error"):
        table.add_column(column, overflow="fold", no_wrap=column == "id")
    for job_id, died, record in rows:
        rec = record or JobRecord(job_id)
        attempts = str(rec.attempts) if record is not None else "?"
        table.add_row(
            job_id,
            rec.task or "?",
            rec.tenant or "?",
            f"{attempts}/{rec.max_attempts if rec.max_attempts is not None else '?'}",
            _when(died),
            _error_text(rec) if record is not None else "(record removed)",
        )
    out.print(table)


async def _redrive(app: App, ids: list[str]) -> list[str]:
    """Redrive ``ids``, or (none given) every dead letter."""
    async with app:
        if ids:
            return await app.redrive(ids)
        done: list[str] = []
        while True:  # each pass takes the oldest dead letters; stop when none move
            moved = await app.redrive(limit=500)
            done += moved
            if not moved:
                return done


@dead_app.command("redrive")
def dead_redrive(
    app_spec: AppSpec,
    ids: Annotated[
        list[str] | None,
        typer.Argument(metavar="[IDS]...", help="Job ids to send back.", show_default=False),
    ] = None,
    every: Annotated[
        bool, typer.Option("--all", help="Send back every dead-lettered job.")
    ] = False,
    redis_url: RedisUrl = None,
) -> None:
    """Send dead-lettered jobs back to their queues with a fresh attempt budget."""
    wanted = list(dict.fromkeys(ids or []))
    if bool(wanted) == every:
        fail("give job ids or --all (not both)", EXIT_USAGE)
    app = load_app(app_spec, redis_url)
    moved = run(_redrive(app, wanted))
    console().print(f"redrove {len(moved)} job(s)")
    missed = [job_id for job_id in wanted if job_id not in set(moved)]
    if missed:
        fail(f"not dead-lettered (unknown or not failed): {', '.join(missed)}")


# -- one job ---------------------------------------------------------------------------


async def _record(app: App, job_id: str) -> JobRecord | None:
    async with app:
        return await app.store_for_job(job_id).read_job(job_id)


async def _cancel(app: App, job_id: str) -> str:
    async with app:
        return await app.store_for_job(job_id).cancel(job_id)


@job_app.command("status")
def job_status(
    app_spec: AppSpec,
    job_id: JobId,
    redis_url: RedisUrl = None,
) -> None:
    """Show a job's record: status, task, tenant, attempts, times, result or last error."""
    app = load_app(app_spec, redis_url)
    record = run(_record(app, job_id))
    if record is None:
        fail(
            f"no record of job {job_id} in app {app.name!r} (never enqueued, or removed by "
            "retention)"
        )
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for label, value in _job_fields(record):
        table.add_row(label, escape(value))
    console().print(table)


def _job_fields(rec: JobRecord) -> list[tuple[str, str]]:
    of = str(rec.max_attempts) if rec.max_attempts is not None else "-"
    rows = [
        ("id", rec.id),
        ("status", (rec.status or "-") + (" (cancel requested)" if rec.cancel_requested else "")),
        ("task", rec.task or "-"),
        ("tenant", rec.tenant or "-"),
        ("lane", rec.lane or "-"),
        ("attempts", f"{rec.attempts} of {of}"),
        ("enqueued", _when(_ms(rec.enqueued_ms))),
        ("started", _when(_ms(rec.started_ms))),
        ("finished", _when(_ms(rec.finished_ms))),
    ]
    if rec.result:
        result = field_text(rec.result)
        rows.append(("result", result if len(result) <= 500 else result[:497] + "..."))
    if rec.error:
        rows.append(("error", _error_text(rec, None)))
    return rows


@job_app.command("cancel")
def job_cancel(
    app_spec: AppSpec,
    job_id: JobId,
    redis_url: RedisUrl = None,
) -> None:
    """Cancel a job: a waiting one at once, a running one at its worker's next lease renewal."""
    app = load_app(app_spec, redis_url)
    status = run(_cancel(app, job_id))
    messages = {
        "cancelled": f"job {job_id} cancelled",
        "cancelling": f"job {job_id} is running: its worker has been asked to stop it",
    }
    if status == "missing":
        fail(f"no record of job {job_id} in app {app.name!r}", EXIT_FAILURE)
    console().print(messages.get(status, f"job {job_id} is already {status}: nothing to cancel"))
