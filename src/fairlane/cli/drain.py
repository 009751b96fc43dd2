"""``fairlane drain APP``: cancel every waiting job a filter matches (``App.drain``).

It counts first (a dry run: nothing changes), asks before cancelling unless ``--yes``,
shows a progress bar while the store cancels the jobs in bounded chunks, and prints the
final count. Stopped half-way (Ctrl-C, a killed process), the same command run again
finishes the drain: it is idempotent by its filter. Each drain is written to the app's
audit trail as done by ``cli:<user>``.
"""

from __future__ import annotations

import getpass
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bar

from fairlane.app import App
from fairlane.app.drain import DrainProgress, DrainReport, describe, drain_filter
from fairlane.cli._common import EXIT_USAGE, AppSpec, RedisUrl, console, fail, load_app, run
from fairlane.errors import UnknownTask

__all__ = ["drain"]

#: the exit code of a drain stopped by Ctrl-C (128 + SIGINT), as a shell reports it
EXIT_INTERRUPTED = 130

_TIME_HELP = (
    "seconds since the epoch, or an ISO 8601 date-time (without a zone: UTC), "
    "e.g. 2025-06-01T12:00:00Z"
)


def _moment(text: str | None, option: str) -> datetime | None:
    if text is None:
        return None
    try:
        return datetime.fromtimestamp(float(text), UTC)
    except (ValueError, OverflowError, OSError):
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        fail(f"{option} takes {_TIME_HELP}; not {text!r}", EXIT_USAGE)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no user name to be found (a container's bare uid)
        return "cli"


async def _count(app: App, filters: dict[str, Any]) -> DrainReport:
    async with app:
        return await app.drain(dry_run=True, **filters)


async def _drain(app: App, filters: dict[str, Any], total: int, told: list[int]) -> DrainReport:
    columns = (
        TextColumn("cancelling"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    async with app:
        with Bar(*columns, console=console(), transient=False) as bar:
            task = bar.add_task("drain", total=total)

            def show(progress: DrainProgress) -> None:
                told[0] = progress.matched
                # jobs that moved between sources while the count was taken may add a few
                bar.update(task, completed=progress.matched, total=max(total, progress.matched))

            return await app.drain(progress=show, actor=_actor(), **filters)


def drain(  # noqa: PLR0917 - each parameter is a command-line option
    app_spec: AppSpec,
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Only this tenant's jobs (its shard alone).")
    ] = None,
    fairness_key: Annotated[
        str | None, typer.Option("--fairness-key", help="Only jobs of this fairness key.")
    ] = None,
    task: Annotated[str | None, typer.Option("--task", help="Only jobs of this task.")] = None,
    lane: Annotated[str | None, typer.Option("--lane", help="Only jobs of this lane.")] = None,
    service_class: Annotated[
        str | None, typer.Option("--class", help="Only jobs of this service class.")
    ] = None,
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state",
            help="Only jobs in this waiting state: queued, throttled, deferred or scheduled "
            "(repeat, or separate by commas, for several; default: all four). Running jobs "
            "are never drained.",
        ),
    ] = None,
    enqueued_before: Annotated[
        str | None,
        typer.Option("--enqueued-before", help=f"Only jobs enqueued before: {_TIME_HELP}."),
    ] = None,
    enqueued_after: Annotated[
        str | None,
        typer.Option("--enqueued-after", help=f"Only jobs enqueued at or after: {_TIME_HELP}."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count the jobs it would cancel; change nothing.")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    redis_url: RedisUrl = None,
) -> None:
    """Cancel every waiting job of MODULE:APP that the filters match, however many: in
    bounded chunks, so other tenants' work goes on meanwhile. Counts first and asks;
    run it again to finish a drain that was stopped."""
    app = load_app(app_spec, redis_url)
    filters: dict[str, Any] = {
        "tenant": tenant,
        "fairness_key": fairness_key,
        "task": task,
        "lane": lane,
        "service_class": service_class,
        "state": [s for given in state or () for s in given.split(",") if s] or None,
        "enqueued_before": _moment(enqueued_before, "--enqueued-before"),
        "enqueued_after": _moment(enqueued_after, "--enqueued-after"),
    }
    try:
        text = describe(drain_filter(app.registry, **filters))
    except (UnknownTask, ValueError) as exc:
        fail(str(exc), EXIT_USAGE)
    out = console()
    counted = run(_count(app, filters))
    jobs = f"{counted.matched} waiting job(s)"
    out.print(f"{jobs} of app {app.name!r} match: {escape(text)}")
    if dry_run or counted.matched == 0:
        if counted.matched == 0:
            out.print("nothing to drain")
        return
    if not yes:
        typer.confirm(f"Cancel {jobs}?", abort=True)
    told = [0]
    try:
        report = run(_drain(app, filters, counted.matched, told))
    except KeyboardInterrupt:
        out.print(
            f"stopped after cancelling {told[0]} job(s); run the same command again to finish"
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    out.print(
        f"cancelled {report.cancelled} job(s) in {report.seconds:.1f} s "
        f"({report.calls} calls, the longest {report.longest_call_us / 1000:.1f} ms of server "
        f"time; {report.rounds} round(s), {report.shards} shard(s))"
    )
