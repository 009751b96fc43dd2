"""Error answers: one JSON shape (``ErrorBody``) for every refusal, and the handlers
that give validation errors, a key outside its scope, an unreachable store, a full one
and a busy one that shape. 503 means the store cannot be reached or is full, nothing
else: a gateway or store that is only busy answers 429 (``frontdoor``)."""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from fairlane.app.admission import STORE_FULL, UNAVAILABLE_RETRY_AFTER
from fairlane.errors import StoreFull
from fairlane.gateway.auth import OutOfScope
from fairlane.gateway.models import ErrorBody
from fairlane.store.gate import StoreBusy
from fairlane.store.wire import StoreUnavailable

__all__ = ["RETRY_AFTER_HEADER", "error", "install_handlers", "responses"]

RETRY_AFTER_HEADER: dict[str, Any] = {
    "Retry-After": {
        "description": "Whole seconds to wait before trying again.",
        "schema": {"type": "integer", "minimum": 1},
    },
    "Cache-Control": {
        "description": "`no-store`: the answer holds for this moment only.",
        "schema": {"type": "string", "enum": ["no-store"]},
    },
}
#: answers that say "not now" (429, 503): a cache that kept one would keep refusing
_NOT_NOW = frozenset({429, 503})


def error(
    status: int,
    detail: str,
    reason: str | None = None,
    retry_after: float | None = None,
    *,
    fields: dict[str, Any] | None = None,
) -> JSONResponse:
    """An ``ErrorBody`` answer; with ``retry_after``, a ``Retry-After`` header too, and
    429 and 503 with ``Cache-Control: no-store``. ``fields``: fields of ``ErrorBody``
    the body holds even when null (an absent field would read as "not said")."""
    body = ErrorBody(detail=detail, reason=reason, retry_after_seconds=retry_after)
    content = body.model_dump(exclude_none=True)
    for name, value in (fields or {}).items():
        if name not in ErrorBody.model_fields:
            raise ValueError(f"ErrorBody has no field {name!r}")
        content[name] = value
    headers = {}
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    if status in _NOT_NOW:
        headers["Cache-Control"] = "no-store"
    return JSONResponse(content, status_code=status, headers=headers)


_DESCRIPTIONS = {
    400: "The body is not JSON.",
    401: "No API key, or one that is unknown, revoked, rotated or expired.",
    403: "The key lacks the scope this endpoint needs (reason `scope`), or the admin key "
    "only reads jobs.",
    404: "No such job or run for this tenant.",
    410: "The job's result was kept in the payload store and can no longer be read.",
    413: "The request body, or the encoded arguments, are too large.",
    422: "The request or the task's arguments do not validate.",
    429: "Not now, and nothing was done: retry after Retry-After seconds (whole seconds; "
    "the body's `retry_after_seconds` is exact). The reason says why. The gateway's front "
    "door, before the store is asked: `tenant_rate` (this tenant's submits per second in "
    "this gateway process; Retry-After is the wait for its next token), `tenant_in_flight` "
    "(this tenant's requests at once), `gateway_busy` (the seats on the store are taken "
    "and this tenant holds or waits for the most, or its turn did not come in time), "
    "`store_busy` (every connection to the store stayed in use for as long as a call may "
    "wait). Admission, for a submit: a full class or queue, or `store_full` (the store's "
    "memory mark); `deadline_unmeetable` (the job is not expected to finish by its "
    "deadline: the body's `estimated_start` says when it was expected to start) comes "
    "without Retry-After, as no wait can be promised to change the answer: a later "
    'deadline or `on_unmeetable: "accept"` does. A tenant refused again by the front '
    "door before its last Retry-After ran out gets this answer only after a hold "
    "(`front_door.refusal_hold`, 1 s).",
    503: "The store cannot be reached (reason `store_unavailable`), or it is full and "
    "refused the write (`store_full`): retry after Retry-After seconds. A busy gateway or "
    "store answers 429, never 503.",
}


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for these error codes (401, 422, 429 and 503 are always possible;
    a declared 422 replaces FastAPI's own validation-error schema with ``ErrorBody``)."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in sorted({401, 422, 429, 503, *codes}):
        entry: dict[str, Any] = {"model": ErrorBody, "description": _DESCRIPTIONS[code]}
        if code in (429, 503):
            entry["headers"] = RETRY_AFTER_HEADER
        if code == 401:
            entry["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
        out[code] = entry
    return out


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": [str(part) for part in e.get("loc", ())], "msg": str(e.get("msg", ""))}
        for e in exc.errors()
    ]
    body = ErrorBody(detail="the request does not validate", reason="invalid", errors=errors)
    return JSONResponse(body.model_dump(exclude_none=True), status_code=422)


async def _out_of_scope(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OutOfScope)
    return error(403, str(exc), "scope")


async def _full(request: Request, exc: Exception) -> JSONResponse:
    # a write the full store refused outside a submit (a submit answers 429 store_full)
    assert isinstance(exc, StoreFull)
    return error(503, "the store is full; nothing was done", STORE_FULL, exc.retry_after)


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    return error(
        503,
        "the store cannot be reached; nothing was done",
        "store_unavailable",
        UNAVAILABLE_RETRY_AFTER,
    )


async def _busy(request: Request, exc: Exception) -> JSONResponse:
    # the store answers; this process's callers outnumbered its connections: backpressure
    return error(
        429,
        "every connection to the store stayed in use for as long as a call may wait; "
        "nothing was done",
        "store_busy",
        UNAVAILABLE_RETRY_AFTER,
    )


def install_handlers(api: FastAPI) -> None:
    api.add_exception_handler(RequestValidationError, _invalid)
    api.add_exception_handler(OutOfScope, _out_of_scope)
    api.add_exception_handler(StoreUnavailable, _unavailable)
    api.add_exception_handler(StoreBusy, _busy)
    api.add_exception_handler(StoreFull, _full)
