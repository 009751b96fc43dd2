"""The dashboard's JSON endpoints under ``/ui/api``: reads for every view, and the writes
(cancel, retry, re-drive; one job or every job a filter matches), all for the admin only;
pauses have endpoints of their own (``pausing``).

Reads: ``GET session``, ``overview``, ``jobs`` (filters ``state`` (repeatable or
comma-separated), ``tenant``, ``class``, ``task``, ``limit``), ``jobs/{id}``, ``dead``,
``runs``, ``audit`` (the gateway's audit trail, newest first; filters ``tenant``,
``action``, ``limit``). Writes: ``POST jobs/{id}/{action}`` and ``POST bulk``; each is
refused 403 in read-only mode, for an action not allowed, or without the CSRF token
when the caller uses the session cookie (``auth.require_write``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from pydantic import BaseModel, Field

from fairlane.app.workflows import Workflow
from fairlane.gateway.audit import trail
from fairlane.gateway.state import GatewayState
from fairlane.gateway.ui import actions
from fairlane.gateway.ui.auth import (
    Operator,
    UiSettings,
    csrf_token,
    require_write,
    session_secret,
    ui_operator,
    ui_settings,
    ui_state,
)
from fairlane.gateway.ui.jobs import STATES, Filter, find_jobs, job_detail
from fairlane.gateway.ui.queries import overview
from fairlane.store.audit import ACTIONS

__all__ = ["BulkRequest", "api_router"]

State = Annotated[GatewayState, Depends(ui_state)]
Settings = Annotated[UiSettings, Depends(ui_settings)]
Who = Annotated[Operator, Depends(ui_operator)]
JobId = Annotated[str, Path(min_length=1, max_length=128)]
Action = Literal["cancel", "retry", "redrive"]


def _no_store(response: Response) -> None:
    # operator data must not linger in shared or browser caches
    response.headers["Cache-Control"] = "no-store"


class BulkRequest(BaseModel):
    """A bulk action on every job a filter matches (at most ``limit``). Without
    ``confirm`` nothing changes and the answer is the count; send that count back as
    ``confirm`` to act."""

    action: Action
    states: list[str] = Field(default_factory=list, max_length=len(STATES))
    tenant: str | None = Field(default=None, max_length=200)
    service_class: str | None = Field(default=None, alias="class", max_length=200)
    task: str | None = Field(default=None, max_length=200)
    limit: int = Field(default=actions.BULK_MAX, ge=1, le=actions.BULK_MAX)
    confirm: int | None = Field(default=None, ge=0)


def _filter(states: list[str], tenant: str | None, cls: str | None, task: str | None) -> Filter:
    wanted = frozenset(s.strip() for part in states for s in part.split(",") if s.strip())
    try:
        return Filter(wanted, tenant or None, cls or None, task or None)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc


router = APIRouter(prefix="/api", include_in_schema=False, dependencies=[Depends(_no_store)])


@router.get("/session")
async def session(who: Who, state: State, settings: Settings) -> dict[str, Any]:
    csrf = None
    if who.nonce is not None and state.admin_key:
        csrf = csrf_token(session_secret(state.admin_key), who.nonce)
    allowed = sorted(a for a in settings.actions if settings.allows(a))
    return {
        "app": state.app.name,
        "read_only": settings.read_only,
        "actions": allowed,
        # pauses: the admin key's operate scope, and a dashboard that may write
        "operate": who.operates and not settings.read_only,
        "csrf": csrf,
        "bulk_max": actions.BULK_MAX,
        "states": list(STATES),
    }


@router.get("/overview")
async def live(who: Who, state: State) -> dict[str, Any]:
    return await overview(await state.connected())


@router.get("/jobs")
async def jobs(
    *,
    who: Who,
    state: State,
    states: Annotated[list[str], Query(alias="state", max_length=len(STATES))] = [],  # noqa: B006 - FastAPI copies it
    tenant: Annotated[str | None, Query(max_length=200)] = None,
    cls: Annotated[str | None, Query(alias="class", max_length=200)] = None,
    task: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> dict[str, Any]:
    app = await state.connected()
    found = await find_jobs(app, _filter(states, tenant, cls, task), limit)
    return {**found, "tasks": sorted(app.tasks)}


@router.get("/jobs/{job_id}")
async def job(job_id: JobId, who: Who, state: State) -> dict[str, Any]:
    detail = await job_detail(await state.connected(), job_id)
    if detail is None:
        raise HTTPException(404, f"no record of job {job_id!r} (never enqueued, or removed)")
    return detail


@router.get("/dead")
async def dead(
    who: Who, state: State, limit: Annotated[int, Query(ge=1, le=500)] = 100
) -> dict[str, Any]:
    return await find_jobs(await state.connected(), Filter(frozenset({"dead"})), limit)


@router.get("/runs")
async def runs(
    who: Who, state: State, limit: Annotated[int, Query(ge=1, le=500)] = 100
) -> dict[str, Any]:
    app = await state.connected()
    rows: list[dict[str, Any]] = []
    flows = sorted(n for n, t in app.tasks.items() if isinstance(t, Workflow))
    for name in flows:
        rows += (await find_jobs(app, Filter(task=name), limit))["jobs"]
    rows.sort(key=lambda r: (r["enqueued_ms"] or 0, r["id"]), reverse=True)
    return {"jobs": rows[:limit], "matched": len(rows), "workflows": flows}


@router.get("/audit")
async def audit(
    *,
    who: Who,
    state: State,
    tenant: Annotated[str | None, Query(max_length=200)] = None,
    action: Annotated[str | None, Query(max_length=40)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> dict[str, Any]:
    if action and action not in ACTIONS:
        raise HTTPException(422, f"action must be one of {', '.join(ACTIONS)}")
    await state.connected()
    entries = await trail(state).read(limit, tenant=tenant or None, action=action or None)
    return {"entries": [msgspec.structs.asdict(e) for e in entries], "actions": list(ACTIONS)}


@router.post("/jobs/{job_id}/{action}")
async def act(
    request: Request,
    *,
    job_id: JobId,
    action: Action,
    who: Who,
    state: State,
    settings: Settings,
) -> dict[str, Any]:
    require_write(action, request, who, state, settings)
    app = await state.connected()
    outcome = await actions.one(app, action, job_id)
    if outcome["result"] == "missing":
        raise HTTPException(404, f"no record of job {job_id!r}")
    return outcome


@router.post("/bulk")
async def bulk(
    request: Request, *, body: BulkRequest, who: Who, state: State, settings: Settings
) -> Any:
    require_write(body.action, request, who, state, settings)
    flt = _filter(body.states, body.tenant, body.service_class, body.task)
    answer = await actions.bulk(
        await state.connected(), body.action, flt, limit=body.limit, confirm=body.confirm
    )
    if body.confirm is not None and not answer["done"]:
        raise HTTPException(
            409,
            f"{answer['count']} jobs match now, not {body.confirm}: confirm again",
        )
    return answer


def api_router() -> APIRouter:
    return router
