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

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute, APIRouter
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from fairlane.gateway.auth import Caller, bearer, caller
from fairlane.gateway.state import GatewayState

__all__ = ["LeanDispatch", "LeanEndpoint", "LeanRoute", "lean"]

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

    @classmethod
    def last_of(cls, router: APIRouter) -> LeanRoute:
        """The route just added to ``router``, which must be a lean one."""
        route = router.routes[-1]
        if not isinstance(route, cls):
            raise TypeError(f"not a lean route: {route!r}")
        return route

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        model = self.body_field.field_info.annotation if self.body_field else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise TypeError(f"a lean route takes a body model: {self.path}")
        return lean(model, self.endpoint, self.status_code or 200)


class LeanDispatch:
    """ASGI middleware: requests for a lean route go straight to its handler, past the
    framework's own layers (routing, exit stacks, exception middleware), which cost
    as much again as the handler on ``POST /v1/jobs``. Add it innermost (first), so the
    gateway's own middlewares (body limit, metrics) still see every request. The
    handler's refusals are answered by the app's exception handlers, as the router
    would have; ``scope["route"]`` is set as the router sets it."""

    def __init__(self, app: ASGIApp, api: FastAPI, route: LeanRoute) -> None:
        self.app = app
        self.api = api
        self.route = route
        self.handler = route.get_route_handler()
        self.key = (route.path, frozenset(route.methods or ()))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("path") != self.route.path
            or scope.get("method") not in self.key[1]
        ):
            await self.app(scope, receive, send)
            return
        scope["route"] = self.route
        request = Request(scope, receive, send)
        try:
            response = await self.handler(request)
        except Exception as exc:
            handler = self._handler_for(exc)
            if handler is None:
                raise
            response = await handler(request, exc)
        await response(scope, receive, send)

    def _handler_for(self, exc: Exception) -> Any:
        handlers = self.api.exception_handlers
        for kind in type(exc).__mro__:
            if kind in handlers:
                return handlers[kind]
        return None
