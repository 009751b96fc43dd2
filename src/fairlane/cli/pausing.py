"""``fairlane pause``, ``resume`` and ``pauses``; ``fairlane tenants pause``, ``resume``
and ``quarantine``: an operator's holds on dispatch and on a tenant's submissions
(``fairlane.app.pauses``).

Every action names its scope, is checked against the app's declarations before anything
is written (an unknown task, lane, class or tenant, an expiry not in the future: exit 2,
nothing changed), prints what it did, and goes to the audit trail with the operator's
login name and the reason.
"""

from __future__ import annotations

import getpass
import time
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from fairlane.app import App
from fairlane.app.pauses import PauseReport, ResumeReport, scope_text
from fairlane.cli._common import EXIT_USAGE, AppSpec, RedisUrl, console, fail, load_app, run
from fairlane.policy.pauses import Scope
from fairlane.policy.retention import parse_duration

__all__ = ["pause", "pauses", "resume", "tenants_pause", "tenants_quarantine", "tenants_resume"]

Task = Annotated[str | None, typer.Option("--task", help="Pause a task's jobs.")]
Lane = Annotated[str | None, typer.Option("--lane", help="Pause a lane's jobs.")]
Cls = Annotated[
    str | None, typer.Option("--class", help="With --lane: only this class of the lane.")
]
TenantOpt = Annotated[
    str | None, typer.Option("--tenant", help="With --fairness-key: the key's tenant.")
]
Key = Annotated[str | None, typer.Option("--fairness-key", help="One fairness key of --tenant.")]
Reason = Annotated[str, typer.Option("--reason", help="Why: shown wherever the pause is.")]
For = Annotated[
    str | None,
    typer.Option("--for", metavar="DURATION", help='Ends by itself after "30m", "2h", ...'),
]
CancelRunning = Annotated[
    bool,
    typer.Option(
        "--cancel-running", help="Also cancel its running jobs, at their next lease renewal."
    ),
]
TenantArg = Annotated[str, typer.Argument(metavar="TENANT")]


def _who() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


def _for(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        fail(f"--for {text!r}: {exc}", EXIT_USAGE)


def _scope(app: App, **names: Any) -> Scope:
    try:
        return app.pauses.scope(**names)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)


async def _pause(
    app: App, scope: Scope, reason: str, seconds: float | None, cancel: bool
) -> PauseReport:
    async with app:
        return await app.pauses.pause(
            scope, reason=reason, for_=seconds, cancel_running=cancel, by=_who()
        )


async def _resume(app: App, scope: Scope) -> ResumeReport:
    async with app:
        return await app.pauses.resume(scope, by=_who())


def _said_pause(report: PauseReport) -> None:
    what = scope_text(report.scope)
    until = (
        "until resumed"
        if report.until_ms == 0
        else time.strftime("until %Y-%m-%d %H:%M:%S UTC", time.gmtime(report.until_ms / 1000))
    )
    again = " (it was paused already: its end and reason are replaced)" if report.already else ""
    console().print(f"paused {escape(what)} {until}{again}")
    if report.running_asked:
        console().print(f"asked {report.running_asked} running job(s) to stop")


def _said_resume(report: ResumeReport) -> None:
    what = scope_text(report.scope)
    if not report.was_paused:
        fail(f"{what} is not paused; nothing changed")
    moved = f"; {report.moved_back} parked job(s) back in their queues" if report.moved_back else ""
    console().print(f"resumed {escape(what)}{moved}")


def _do_pause(app: App, scope: Scope, reason: str, for_: str | None, cancel: bool) -> PauseReport:
    try:
        return run(_pause(app, scope, reason, _for(for_), cancel))
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)


def pause(  # noqa: PLR0917 - each parameter is a command-line option
    app_spec: AppSpec,
    task: Task = None,
    lane: Lane = None,
    cls: Cls = None,
    tenant: TenantOpt = None,
    fairness_key: Key = None,
    reason: Reason = "",
    for_: For = None,
    cancel_running: CancelRunning = False,
    redis_url: RedisUrl = None,
) -> None:
    """Stop dispatch of a task's or a lane's (or one class's) jobs, or of one fairness key
    of a tenant: nothing new of it starts; waiting jobs keep their places; running ones
    finish unless --cancel-running. `fairlane tenants pause` pauses a whole tenant."""
    if tenant and not fairness_key:
        fail("a whole tenant is paused with `fairlane tenants pause APP TENANT`", EXIT_USAGE)
    app = load_app(app_spec, redis_url)
    scope = _scope(app, task=task, lane=lane, cls=cls, tenant=tenant, fairness_key=fairness_key)
    _said_pause(_do_pause(app, scope, reason, for_, cancel_running))


def resume(  # noqa: PLR0917 - each parameter is a command-line option
    app_spec: AppSpec,
    task: Task = None,
    lane: Lane = None,
    cls: Cls = None,
    tenant: TenantOpt = None,
    fairness_key: Key = None,
    redis_url: RedisUrl = None,
) -> None:
    """End a pause made by `fairlane pause`: its jobs are dispatched again, at their places."""
    if tenant and not fairness_key:
        fail("a whole tenant is resumed with `fairlane tenants resume APP TENANT`", EXIT_USAGE)
    app = load_app(app_spec, redis_url)
    scope = _scope(app, task=task, lane=lane, cls=cls, tenant=tenant, fairness_key=fairness_key)
    _said_resume(run(_resume(app, scope)))


async def _list(app: App) -> Table:
    async with app:
        entries = await app.pauses.list()
    table = Table("scope", "until", "reason", "by", "since", "parked jobs")
    for e in entries:
        until = "resumed" if e.until_ms == 1 else "-" if e.until_ms == 0 else _utc(e.until_ms)
        table.add_row(
            escape(scope_text(e.scope)), until, escape(e.reason), escape(e.by), _utc(e.at_ms),
            str(e.parked),
        )  # fmt: skip
    return table


def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))


def pauses(app_spec: AppSpec, redis_url: RedisUrl = None) -> None:
    """List the pauses and quarantines in force, with who made them and why."""
    table = run(_list(load_app(app_spec, redis_url)))
    if not table.rows:
        console().print("nothing is paused")
        return
    console().print(table)


def tenants_pause(  # noqa: PLR0917 - each parameter is a command-line option
    app_spec: AppSpec,
    tenant: TenantArg,
    reason: Reason = "",
    for_: For = None,
    refuse_submissions: Annotated[
        bool,
        typer.Option(
            "--refuse-submissions", help="Also refuse its new submissions (a quarantine)."
        ),
    ] = False,
    cancel_running: CancelRunning = False,
    redis_url: RedisUrl = None,
) -> None:
    """Pause a tenant: nothing of its starts; its waiting jobs keep their places and its
    share goes to the others; on resume it comes back at a fair place."""
    app = load_app(app_spec, redis_url)
    scope = _scope(app, tenant=tenant)
    _said_pause(_do_pause(app, scope, reason, for_, cancel_running))
    if refuse_submissions:
        _said_pause(_do_pause(app, _scope(app, tenant=tenant, refuse=True), reason, for_, False))


def tenants_quarantine(
    app_spec: AppSpec,
    tenant: TenantArg,
    reason: Reason = "",
    for_: For = None,
    redis_url: RedisUrl = None,
) -> None:
    """Refuse a tenant's new submissions (429 tenant_paused at the gateway, `Rejected` from
    enqueue); its waiting work still runs unless it is paused too."""
    app = load_app(app_spec, redis_url)
    _said_pause(_do_pause(app, _scope(app, tenant=tenant, refuse=True), reason, for_, False))


async def _resume_tenant(app: App, tenant: str) -> ResumeReport:
    async with app:
        return await app.tenants.resume(tenant, by=_who())


def tenants_resume(app_spec: AppSpec, tenant: TenantArg, redis_url: RedisUrl = None) -> None:
    """End a tenant's pause and its quarantine."""
    app = load_app(app_spec, redis_url)
    _said_resume(run(_resume_tenant(app, tenant)))
