"""Signals to workflow runs: ``POST /v1/runs/{run_id}/signals/{name}``, for the run's
own tenant only (another tenant's run is answered 404, like a missing one), with a key
that has the ``signal`` scope (else 403, before the run is looked at)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path
from fastapi.responses import JSONResponse

from fairlane.app.workflows import RunNotFound, Workflow
from fairlane.gateway import audit
from fairlane.gateway.auth import Caller, gateway_state, scoped
from fairlane.gateway.models import SignalReply, SignalRequest
from fairlane.gateway.responses import error, responses
from fairlane.gateway.state import GatewayState
from fairlane.store.records import OWNER

__all__ = ["router"]

router = APIRouter(prefix="/v1/runs", tags=["runs"])


@router.post(
    "/{run_id}/signals/{name}",
    response_model=SignalReply,
    responses=responses(400, 403, 404, 413),
    summary="Send a signal to a workflow run",
)
async def signal(
    run_id: Annotated[str, Path(min_length=1, max_length=128)],
    name: Annotated[str, Path(min_length=1, max_length=200)],
    body: SignalRequest,
    who: Annotated[Caller, Depends(scoped("signal"))],
    state: Annotated[GatewayState, Depends(gateway_state)],
) -> SignalReply | JSONResponse:
    if who.admin:
        return error(403, "the admin key reads jobs; use a tenant's key to signal", "admin")
    app = await state.connected()
    record = await app.store_for_job(run_id).read_job(run_id, OWNER)
    is_run = record is not None and isinstance(app.tasks.get(record.task), Workflow)
    if record is None or not is_run or not who.owns(record.tenant):
        # a plain job, another tenant's run and no run at all look the same
        return error(404, f"no run {run_id!r}", "not_found")
    try:
        outcome = await app.signal(run_id, name, body.payload, signal_id=body.signal_id)
    except RunNotFound:
        return error(404, f"no run {run_id!r}", "not_found")
    except (TypeError, ValueError) as exc:
        return error(422, str(exc), "bad_signal")
    await audit.record(state, who, "signal", outcome, detail=name, job_id=run_id)
    return SignalReply(result=outcome)
