"""The dashboard's pause endpoints under ``/ui/api``: what is paused, and pausing,
resuming and quarantining, through the app's own calls (``fairlane.app.pauses``).

Reads: ``GET pauses`` (every pause and quarantine in force or being lifted, with its
reason, who made it, since and until when, and the jobs it parked; ``operate`` says
whether this caller may change them). Writes, each answering what it did:

- ``POST tenants/{tenant}/pause`` ``{reason, for, refuse_submissions, cancel_running}``
- ``POST tenants/{tenant}/resume`` (its pause and its quarantine)
- ``POST tenants/{tenant}/quarantine`` ``{reason, for}``
- ``POST tasks/{task}/pause`` ``{reason, for, cancel_running}``, ``.../resume``
- ``POST lanes/{lane}/pause`` ``{reason, for, cancel_running, class}``, ``.../resume``
  ``{class}`` (no class: the whole lane)

``for`` is seconds from now (none: until resumed). A write needs the admin key's
``operate`` scope and is refused in read-only mode (403, nothing changed), and, made with
the session cookie, the CSRF token (``auth.require_operate``). Names the app does not
declare, a tenant the store knows nothing of, an expiry not in the future: 422 with the
app's message, nothing changed. A resume of what is not paused: 404, nothing changed.
Every change is in the audit trail (``pause``, ``resume``), its key the admin key's id.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, HTTPException, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from fairlane.app import App
from fairlane.app.pauses import PauseReport, ResumeReport, scope_text
from fairlane.gateway.state import GatewayState
from fairlane.gateway.ui.auth import (
    Operator,
    UiSettings,
    require_operate,
    ui_operator,
    ui_settings,
    ui_state,
)
from fairlane.policy.pauses import Scope
from fairlane.store.pausing import PauseEntry

__all__ = [
    "Acting",
    "LaneName",
    "LanePause",
    "Pause",
    "Quarantine",
    "TenantPause",
    "pausing_router",
]

T = TypeVar("T")

State = Annotated[GatewayState, Depends(ui_state)]
Settings = Annotated[UiSettings, Depends(ui_settings)]
Who = Annotated[Operator, Depends(ui_operator)]
Name = Annotated[str, Path(min_length=1, max_length=200)]

_REASON = Field(default="", max_length=200, description="Why: shown wherever the pause is.")
_FOR = Field(default=None, alias="for", description="Seconds from now it ends (none: resumed).")


def _no_store(response: Response) -> None:
    response.headers["Cache-Control"] = "no-store"


class Quarantine(BaseModel):
    """Refuse a tenant's new submissions, for ``for`` seconds or until resumed."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")
    reason: str = _REASON
    for_: float | None = _FOR


class Pause(Quarantine):
    """A pause: nothing of its scope starts; ``cancel_running`` also asks its running
    jobs to stop at their next lease renewal."""

    cancel_running: bool = False


class TenantPause(Pause):
    """A tenant's pause; ``refuse_submissions`` quarantines it as well."""

    refuse_submissions: bool = False


class LaneName(BaseModel):
    """One class of a lane (none: every class)."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")
    cls: str | None = Field(default=None, alias="class", max_length=200)


class LanePause(Pause):
    """A lane's pause, or one class's."""

    cls: str | None = Field(default=None, alias="class", max_length=200)


def scope_json(scope: Scope) -> dict[str, str]:
    """A scope's kind and names ('' left out), and the words an operator reads."""
    names = {
        "tenant": scope.tenant,
        "fairness_key": scope.key,
        "task": scope.task,
        "lane": scope.lane,
        "class": scope.cls,
    }
    return {"kind": scope.kind.value, **{k: v for k, v in names.items() if v}}


def entry_json(entry: PauseEntry) -> dict[str, Any]:
    """A pause as the dashboard shows it (``until_ms`` None: until resumed)."""
    return {
        "scope": scope_json(entry.scope),
        "text": scope_text(entry.scope),
        "until_ms": entry.until_ms if entry.until_ms > 1 else None,
        "ending": entry.until_ms == 1,
        "reason": entry.reason,
        "by": entry.by,
        "at_ms": entry.at_ms,
        "parked": entry.parked,
    }


def _paused(report: PauseReport) -> dict[str, Any]:
    return {
        "scope": scope_json(report.scope),
        "text": scope_text(report.scope),
        "result": "paused",
        "until_ms": report.until_ms or None,
        "running_asked": report.running_asked,
        "already": report.already,
    }


def _resumed(report: ResumeReport) -> dict[str, Any]:
    if not report.was_paused:
        raise HTTPException(404, f"{scope_text(report.scope)} is not paused; nothing changed")
    return {
        "scope": scope_json(report.scope),
        "text": scope_text(report.scope),
        "result": "resumed",
        "moved_back": report.moved_back,
    }


async def _checked(call: Awaitable[T]) -> T:
    """The app's answer; its refusal of bad input (nothing written) as 422."""
    try:
        return await call
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc


async def _by(who: Operator, state: GatewayState) -> str:
    """Who acts, as the audit trail names it: the key's id (the admin key's derived, in a
    thread: its derivation is slow on purpose)."""
    if who.key_id:
        return who.key_id
    return await run_in_threadpool(state.admin_key_id) if state.admin_key else "dashboard"


router = APIRouter(prefix="/api", include_in_schema=False, dependencies=[Depends(_no_store)])


@router.get("/pauses")
async def pauses(who: Who, state: State, settings: Settings) -> dict[str, Any]:
    app = await state.connected()
    entries = await app.pauses.list()
    return {
        "now_ms": await app.store.server_time_ms(),
        "operate": who.operates and not settings.read_only,
        "pauses": [entry_json(e) for e in entries],
    }


@dataclass(frozen=True, slots=True)
class Acting:
    """A write allowed (``require_operate``): the app, and who acts as the trail names it."""

    app: App
    by: str

    async def pause(self, scope: Scope, body: Pause) -> dict[str, Any]:
        report = await _checked(
            self.app.pauses.pause(
                scope,
                reason=body.reason,
                for_=body.for_,
                cancel_running=body.cancel_running,
                by=self.by,
            )
        )
        return _paused(report)

    async def resume(self, scope: Scope) -> dict[str, Any]:
        return _resumed(await self.app.pauses.resume(scope, by=self.by))

    def scope(self, **names: Any) -> Scope:
        try:
            return self.app.pauses.scope(**names)
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from exc


async def acting(request: Request, who: Who, state: State, settings: Settings) -> Acting:
    """Refused before anything is read: no ``operate`` scope, read-only, or no token."""
    require_operate(request, who, state, settings)
    return Acting(await state.connected(), await _by(who, state))


Act = Annotated[Acting, Depends(acting)]


@router.post("/tenants/{tenant:path}/pause")
async def pause_tenant(tenant: Name, body: TenantPause, act: Act) -> dict[str, Any]:
    # as app.tenants.pause does: the pause, then the quarantine it asks for
    answer = await act.pause(act.scope(tenant=tenant), body)
    if body.refuse_submissions:
        await quarantine_tenant(tenant, body, act)
    return {**answer, "refuse_submissions": body.refuse_submissions}


@router.post("/tenants/{tenant:path}/quarantine")
async def quarantine_tenant(tenant: Name, body: Quarantine, act: Act) -> dict[str, Any]:
    quarantine = act.app.tenants.quarantine(tenant, reason=body.reason, for_=body.for_, by=act.by)
    return _paused(await _checked(quarantine))


@router.post("/tenants/{tenant:path}/resume")
async def resume_tenant(tenant: Name, act: Act) -> dict[str, Any]:
    return _resumed(await _checked(act.app.tenants.resume(tenant, by=act.by)))


@router.post("/tasks/{task}/pause")
async def pause_task(task: Name, body: Pause, act: Act) -> dict[str, Any]:
    return await act.pause(act.scope(task=task), body)


@router.post("/tasks/{task}/resume")
async def resume_task(task: Name, act: Act) -> dict[str, Any]:
    return await act.resume(act.scope(task=task))


@router.post("/lanes/{lane}/pause")
async def pause_lane(lane: Name, body: LanePause, act: Act) -> dict[str, Any]:
    return await act.pause(act.scope(lane=lane, cls=body.cls), body)


@router.post("/lanes/{lane}/resume")
async def resume_lane(lane: Name, act: Act, body: LaneName | None = None) -> dict[str, Any]:
    return await act.resume(act.scope(lane=lane, cls=body.cls if body else None))


def pausing_router() -> APIRouter:
    return router
