"""``LeanRoute``: an operation declared to FastAPI as usual, served without its
per-request machinery.

FastAPI reads an operation's signature twice: once to write the OpenAPI spec, and on
every request to solve its dependencies, validate its body and validate and encode the
answer through the response model, with exit stacks and telemetry around each step.
On ``POST /v1/jobs``, the gateway's hot path, that machinery cost more than the
submission itself. A lean route keeps the first reading (the spec is FastAPI's, from
the same endpoint) and replaces the second by what the endpoint needs, written out:
the caller from the bearer key (``auth.caller``, the same check), the body as the
declared model (pydantic, from the raw JSON in one step, the same constraints), and
the endpoint's own answer encoded once. Its refusals keep their shapes: a body that
does not validate gets the 422 of ``responses._invalid``, a bad key the 401 of
``auth.caller``, an unreachable store the 503 of ``responses._unavailable``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from fairlane.gateway.auth import Caller, bearer, caller
from fairlane.gateway.state import GatewayState

__all__ = ["LeanEndpoint", "LeanRoute", "lean"]

#: what a lean endpoint takes: its body, caller, the gateway and the request
LeanEndpoint = Callable[[Any, Caller, GatewayState, Request], Awaitable[BaseModel | Response]]

_JSON = "application/json"


def _is_json(content_type: str | None) -> bool:
    if content_type is None:
        return False  # as FastAPI's strict content type: no type, no JSON
    kind = content_type.partition(";")[0].strip().lower()
    return kind == _JSON or (kind.startswith("application/") and kind.endswith("+json"))


def _refused(exc: ValidationError) -> RequestValidationError:
    # the errors FastAPI would give, located in the body as it locates them
    return RequestValidationError(
        [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors(include_url=False)]
    )


def lean(
    model: type[BaseModel], endpoint: LeanEndpoint, status_code: int
) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    """The request handler of a lean route: ``endpoint(body, caller, state, request)``
    with ``body`` a ``model``; a model it answers is sent as JSON with ``status_code``,
    a response as it is."""

    async def handle(request: Request) -> Response:
        state: GatewayState = request.app.state.gateway
        # the key first: an unauthenticated caller learns nothing of the body's checks
        who = await caller(state, await bearer(request))
        raw = await request.body()
        if not raw or not _is_json(request.headers.get("content-type")):
            raise RequestValidationError(
                [{"type": "missing", "loc": ("body",), "msg": "a JSON body is required"}]
            )
        try:
            body = model.model_validate_json(raw)
        except ValidationError as exc:
            raise _refused(exc) from None
        answer = await endpoint(body, who, state, request)
        if isinstance(answer, Response):
            return answer
        return Response(answer.model_dump_json(), status_code, media_type=_JSON)

    return handle


class LeanRoute(APIRoute):
    """An ``APIRoute`` whose endpoint is served by ``lean``: declare it as any other
    (body model first, then the caller, the gateway state and the request), with
    ``route_class_override=LeanRoute``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        model = self.body_field.field_info.annotation if self.body_field else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise TypeError(f"a lean route takes a body model: {self.path}")
        return lean(model, self.endpoint, self.status_code or 200)
