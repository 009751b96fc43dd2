"""The job endpoints: submit (``POST /v1/jobs``), read, long-poll the result, cancel.

Every id a tenant names is checked against the job record's ``tenant`` field; a job of
another tenant is answered exactly like a job that does not exist (404), so ids cannot
be probed. Only tasks registered with ``gateway=True`` are enqueued, by name (any other
answers as an unknown one): nothing a request carries is ever run or imported by the
gateway. Each endpoint needs its scope of the caller's key (``auth.scoped``;
``auth.submitter`` for the submit): ``submit``, ``read`` (both GETs), ``cancel``; a key
without it is answered 403 before the job is looked at. A job's class is the server's to
allow: one that is restricted and not among the tenant's entitled classes answers 403
``class_not_entitled``, and nothing is stored (the store's enqueue decides).

A submit with a deadline, or with ``estimate_start``, takes one read more to estimate
the job's start (``fairlane.app.startestimate``) and answers it as ``estimated_start``;
one with a deadline it is not expected to meet is refused 429 ``deadline_unmeetable``
(no Retry-After) unless ``on_unmeetable`` is ``accept``. Any other submit pays nothing
for estimates. A job's view carries its estimate and what it rests on until it starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Annotated

import msgspec
from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse

from fairlane import tracing
from fairlane.app import App
from fairlane.app.admission import (
    CLASS_NOT_ENTITLED,
    DEADLINE_UNMEETABLE,
    STORE_BUSY,
    STORE_UNAVAILABLE,
    Admission,
)
from fairlane.app.job import TERMINAL, Job
from fairlane.codec import PayloadTooLarge, decode_error
from fairlane.errors import JobNotFound
from fairlane.gateway import audit
from fairlane.gateway.auth import Caller, caller, gateway_state, refused_key, scoped
from fairlane.gateway.frontdoor import give_back_seat
from fairlane.gateway.lean import LeanRoute
from fairlane.gateway.models import (
    CancelReply,
    ErrorBody,
    JobView,
    ResultReply,
    SubmitReply,
    SubmitRequest,
    TaskError,
)
from fairlane.gateway.responses import error, responses
from fairlane.gateway.startview import estimate_view, iso
from fairlane.gateway.state import GatewayState
from fairlane.payloads import PayloadError
from fairlane.registry import CallOptions
from fairlane.store.apikeys import KeyRefused
from fairlane.store.records import OWNER, STATUS

__all__ = ["MAX_WAIT_SECONDS", "SUBMIT_ROUTE", "router"]

MAX_WAIT_SECONDS = 30.0

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

State = Annotated[GatewayState, Depends(gateway_state)]
Who = Annotated[Caller, Depends(caller)]
Reader = Annotated[Caller, Depends(scoped("read"))]
Canceller = Annotated[Caller, Depends(scoped("cancel"))]
JobId = Annotated[str, Path(min_length=1, max_length=128, description="A job id.")]


def _not_found(job_id: str) -> JSONResponse:
    # the same answer for "no such job" and "another tenant's job": ids cannot be probed
    return error(404, f"no job {job_id!r}", "not_found")


def _admin_reads_only() -> JSONResponse:
    return error(403, "the admin key reads jobs; use a tenant's key to change them", "admin")


async def _owner(state: GatewayState, job_id: str) -> str | None:
    app = await state.connected()
    record = await app.store_for_job(job_id).read_job(job_id, OWNER)
    return None if record is None else record.tenant


_SUBMIT_FORBIDDEN = {
    "model": ErrorBody,
    "description": "The key lacks the submit scope (reason `scope`), the admin key submits "
    "nothing (reason `admin`), or the job's class is restricted and this tenant is not "
    "entitled to it (reason `class_not_entitled`); nothing is stored.",
}


async def submit(
    body: SubmitRequest, who: Who, state: State, request: Request
) -> SubmitReply | JSONResponse:
    # served by a LeanRoute (added below): no docstring, as FastAPI would publish it
    if who.tenant is None:
        return error(403, "the admin key has no tenant: submit with a tenant's key", "admin")
    # a caller's W3C trace context (traceparent) continues through the job to its worker
    admission = await _admit(body, who, state, request.headers)
    if isinstance(admission, JSONResponse):
        return admission
    if admission.job is not None and admission.status in ("accepted", "deferred"):
        job = admission.job
        return SubmitReply(
            id=job.id,
            state=admission.status,
            created=job.created,
            status_url=f"/v1/jobs/{job.id}",
            estimated_start=iso(admission.estimated_start),
        )
    return _refused(admission, body)


_UNAVAILABLE = {
    STORE_UNAVAILABLE: "the store cannot be reached; nothing was enqueued",
    STORE_BUSY: "every connection to the store stayed in use for as long as a call may wait; "
    "nothing was enqueued",
}


def _refused(admission: Admission[object], body: SubmitRequest) -> JSONResponse:
    if admission.status == "unavailable":
        detail = _UNAVAILABLE.get(admission.reason or "", _UNAVAILABLE[STORE_UNAVAILABLE])
        # a busy pool is backpressure (429); only a store out of reach is an outage
        status = 429 if admission.reason == STORE_BUSY else 503
        return error(status, detail, admission.reason, admission.retry_after)
    reason = admission.reason or "rejected"
    if reason == CLASS_NOT_ENTITLED:
        named = f" {body.service_class!r}" if body.service_class else " (its task's)"
        detail = f"the job's class{named} is not one this tenant may use; nothing was stored"
        return error(403, detail, reason)
    if reason == DEADLINE_UNMEETABLE:
        return _unmeetable(admission)
    detail = f"the job was not admitted ({reason})"
    retry_after = None if admission.retry_after is None else round(admission.retry_after, 3)
    return error(429, detail, reason, retry_after)


def _unmeetable(admission: Admission[object]) -> JSONResponse:
    # no Retry-After: a wait cannot be promised to change the answer (arrivals only push
    # the start later, and a job whose learned length passes its deadline never fits)
    start = iso(admission.estimated_start)
    said = f"it was expected to start at {start} (an estimate)" if start else "no start estimate"
    detail = (
        f"the job is not expected to finish by its deadline ({said}); nothing was stored: "
        'a later deadline, or on_unmeetable "accept", takes it'
    )
    return error(429, detail, DEADLINE_UNMEETABLE, fields={"estimated_start": start})


router.add_api_route(
    "",
    submit,
    methods=["POST"],
    status_code=202,
    response_model=SubmitReply,
    responses={**responses(400, 403, 413, 429), 403: _SUBMIT_FORBIDDEN},
    summary="Submit a job of an exposed task",
    route_class_override=LeanRoute,
)
#: the submit route, which ``LeanApi`` serves before the framework's layers
SUBMIT_ROUTE = LeanRoute.last_of(router)


async def _admit(
    body: SubmitRequest, who: Caller, state: GatewayState, headers: Mapping[str, str]
) -> Admission[object] | JSONResponse:
    """The store's answer to the call (as ``Task.submit`` gives it), or a refusal of its input."""
    tenant = who.tenant
    assert tenant is not None  # the admin submits nothing
    app = await state.connected()
    task = app.tasks.get(body.task)
    if task is None or not task.options.gateway:
        # a private task and no task at all look the same: names cannot be probed
        await audit.record(state, who, "submit", "refused", detail="unknown_task")
        return error(422, f"this gateway has no task named {body.task!r}", "unknown_task")
    try:
        blob = task.encode_args(tuple(body.args), body.kwargs)
        # the options are the body's named fields only: kwargs go to the task's own
        # arguments, so a body can never set the tenant, lane or limits of a job
        new = task.new_job(
            blob,
            CallOptions(
                tenant=tenant,
                deadline=body.deadline_seconds,
                idempotency_key=body.idempotency_key,
                priority=body.priority,
                service_class=body.service_class,
                estimate=body.estimate,
                fairness_key=body.fairness_key,
            ),
        )
    except PayloadTooLarge as exc:
        await audit.record(state, who, "submit", "refused", detail="too_large")
        return error(413, str(exc), "too_large")
    except (TypeError, ValueError) as exc:
        await audit.record(state, who, "submit", "refused", detail="bad_arguments")
        return error(422, str(exc), "bad_arguments")
    lane = task.options.lane
    with tracing.continuing(headers), tracing.sending(lane, [new]) as span:
        try:
            # as the app's own submissions: with its durability (WAIT/WAITAOF) if set
            admission: Admission[object] = await task.submit_job(
                new,
                guard=who.guard,
                on_unmeetable=body.on_unmeetable,
                estimate_start=body.estimate_start,
            )
        except KeyRefused as refusal:
            raise refused_key(state, who.key_id, refusal) from None
        except ValueError as exc:
            if who.guard is None:  # a guarded enqueue recorded its refusal itself
                await audit.record(state, who, "submit", "refused", detail="refused")
            return error(422, str(exc), "refused")
        tracing.admitted(span, admission)
        await audit.record_admission(state, who, admission)
        return admission


@router.get(
    "/{job_id}", response_model=JobView, responses=responses(403, 404), summary="A job's status"
)
async def read(job_id: JobId, who: Reader, state: State) -> JobView | JSONResponse:
    if not who.may_read(await _owner(state, job_id)):
        return _not_found(job_id)
    app = state.app
    record = await app.store_for_job(job_id).read_job(job_id, OWNER)
    task = app.tasks.get(record.task) if record is not None else None
    if task is None:
        return error(404, f"job {job_id!r} is of a task this gateway does not know", "not_found")
    job: Job[object] = Job(task, job_id)
    try:
        # the estimate is read once, below, with its basis
        info = await job.info(estimate=False)
    except JobNotFound:
        return _not_found(job_id)
    start = None if info.status in _STARTED else await job.start_estimate()
    # the view is the record's snapshot, its times as ISO text
    shown = {name: getattr(info, name) for name in JobView.model_fields if hasattr(info, name)}
    for name in ("enqueued_at", "finished_at", "not_before", "deadline"):
        shown[name] = iso(getattr(info, name))
    shown["estimated_start"] = None if start is None else iso(start.at)
    shown["start_estimate"] = None if start is None else estimate_view(start)
    return JobView(**shown)


#: statuses of a job whose start is behind it: nothing to estimate
_STARTED = TERMINAL | {"running"}


@router.get(
    "/{job_id}/result",
    response_model=ResultReply,
    responses={
        202: {"model": ResultReply, "description": "Not finished within the wait."},
        **responses(403, 404, 410),
    },
    summary="A job's result, waiting up to `wait` seconds for it",
)
async def result(
    job_id: JobId,
    who: Reader,
    state: State,
    request: Request,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_SECONDS, allow_inf_nan=False)] = 0.0,
) -> ResultReply | JSONResponse:
    if not who.may_read(await _owner(state, job_id)):
        return _not_found(job_id)
    app = state.app
    reply = await app.store_for_job(job_id).watch(job_id)
    status = reply[0].decode()
    if status == "missing":
        return _not_found(job_id)
    if status not in TERMINAL and wait > 0:
        give_back_seat(request)  # the wait holds a subscription, not a call slot
        try:
            async with asyncio.timeout(wait):
                status, res, err = await app.wait_finished(job_id)
            reply = [status.encode(), res, err]
        except TimeoutError:
            now = await app.store_for_job(job_id).read_job(job_id, STATUS)
            status = now.status if now is not None and now.status else status
        except JobNotFound:
            return _not_found(job_id)
    if len(reply) < 3 or status not in TERMINAL:
        body = ResultReply(id=job_id, status=status)
        return JSONResponse(body.model_dump(exclude_none=True), status_code=202)
    if status == "completed":
        return await _completed(app, job_id, reply[1])
    info = decode_error(reply[2])
    failed = ResultReply(
        id=job_id, status=status, error=TaskError(type=info.type, message=info.message)
    )
    return JSONResponse(failed.model_dump(exclude_none=True))


async def _completed(app: App, job_id: str, raw: bytes) -> JSONResponse:
    if raw and app.payloads is not None:  # a large result is kept in the payload store
        try:
            raw = await app.payloads.resolve(raw)
        except PayloadError as exc:
            return error(410, f"the job's result cannot be read: {exc}", "result_gone")
    value = msgspec.json.decode(raw) if raw else None
    return JSONResponse({"id": job_id, "status": "completed", "result": value})


@router.delete(
    "/{job_id}", response_model=CancelReply, responses=responses(403, 404), summary="Cancel a job"
)
async def cancel(job_id: JobId, who: Canceller, state: State) -> CancelReply | JSONResponse:
    if who.admin:
        return _admin_reads_only()
    if not who.owns(await _owner(state, job_id)):
        return _not_found(job_id)
    status = await state.app.store_for_job(job_id).cancel(job_id)
    if status == "missing":
        return _not_found(job_id)
    await audit.record(state, who, "cancel", status, job_id=job_id)
    return CancelReply(id=job_id, status=status)
