"""``LeanRoute``: an operation declared to FastAPI as usual, served without its
per-request machinery; ``LeanApi``: the FastAPI app that serves it from the outside in.

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

The framework's layers around the router (its error and telemetry middlewares, the
gateway's body limit and request metrics) cost as much again as the handler, so a
``LeanApi`` answers its lean route before any of them, doing their part itself: the
front door's 429 (``fairlane.gateway.frontdoor``), the body limit's 413, the app's
exception handlers, a 500 for anything else, and one observation for the request
metrics.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute, APIRouter
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from fairlane.gateway.auth import Caller, submitter
from fairlane.gateway.frontdoor import FrontDoor, Refused
from fairlane.gateway.limits import TooLarge, read_within, too_large
from fairlane.gateway.state import GatewayState

__all__ = ["LeanApi", "LeanEndpoint", "LeanRoute", "Observer", "lean"]

#: what a lean endpoint takes: its body, caller, the gateway and the request
LeanEndpoint = Callable[[Any, Caller, GatewayState, Request], Awaitable[BaseModel | Response]]

#: what hears of each answer: (method, route, status, seconds, body)
Observer = Callable[[str, str, int, float, bytes | None], None]
#: a lean handler: the request and its whole body, to the answer
LeanHandler = Callable[[Request, bytes], Coroutine[Any, Any, Response]]

_JSON = "application/json"
#: the status the request metrics count for a client that left before its answer
_CLIENT_LEFT = 499


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


def lean(model: type[BaseModel], endpoint: LeanEndpoint, status_code: int) -> LeanHandler:
    """The request handler of a lean route: ``endpoint(body, caller, state, request)``
    with ``body`` a ``model``; a model it answers is sent as JSON with ``status_code``,
    a response as it is."""

    async def handle(request: Request, raw: bytes) -> Response:
        state: GatewayState = request.app.state.gateway
        # the key first: an unauthenticated caller learns nothing of the body's checks
        who = await submitter(state, request.headers.get("authorization"))
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

    def lean_handler(self) -> LeanHandler:
        model = self.body_field.field_info.annotation if self.body_field else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise TypeError(f"a lean route takes a body model: {self.path}")
        return lean(model, self.endpoint, self.status_code or 200)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        # the router's way in, for an app that is not a LeanApi
        handler = self.lean_handler()

        async def routed(request: Request) -> Response:
            return await handler(request, await request.body())

        return routed


class LeanFront:
    """One lean route served from the outside in: the front door (``door``, if set), the
    body read within ``limit`` bytes, the handler, the app's exception handlers and the
    observation."""

    def __init__(self, api: FastAPI, route: LeanRoute, limit: int) -> None:
        self.api = api
        self.route = route
        self.limit = limit
        self.handler = route.lean_handler()
        self.methods = frozenset(route.methods or ())
        self.observe: Observer | None = None
        self.door: FrontDoor | None = None

    def takes(self, scope: Scope) -> bool:
        return (
            scope["type"] == "http"
            and scope.get("path") == self.route.path
            and scope.get("method") in self.methods
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        scope["app"], scope["route"] = self.api, self.route
        status, body = 500, None  # unless answered: an exception escapes as a server error
        try:
            response = await self._answer(scope, receive, send)
            status, body = response.status_code, bytes(response.body)
            await response(scope, receive, send)
        except ClientDisconnect:
            status = _CLIENT_LEFT  # nobody to answer; nothing was submitted
        finally:
            if self.observe is not None:
                seconds = time.perf_counter() - started
                self.observe(scope.get("method", ""), self.route.path, status, seconds, body)

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> Response:
        request = Request(scope, receive, send)
        door = self.door
        if door is None:
            return await self._serve(request, scope, receive, send)
        try:
            # before the body is read: a tenant past its bounds costs nothing more
            async with door.admitted(request.headers.get("authorization"), submit=True):
                return await self._serve(request, scope, receive, send)
        except Refused as refusal:
            return refusal.response()

    async def _serve(
        self, request: Request, scope: Scope, receive: Receive, send: Send
    ) -> Response:
        try:
            raw = await read_within(scope, receive, self.limit)
        except TooLarge:
            return too_large(self.limit)
        if not isinstance(raw, bytes):
            raise ClientDisconnect
        try:
            return await self.handler(request, raw)
        except Exception as exc:
            handler = self._handler_for(exc)
            if handler is None:
                # as the framework's error middleware: a plain 500, and the error logged
                await PlainTextResponse("Internal Server Error", 500)(scope, receive, send)
                raise
            answer: Response = await handler(request, exc)
            return answer

    def _handler_for(self, exc: Exception) -> Any:
        handlers = self.api.exception_handlers
        for kind in type(exc).__mro__:
            if kind in handlers:
                return handlers[kind]
        return None


class LeanApi(FastAPI):
    """A FastAPI app that answers its lean route (``serve_lean``) before its own layers
    and middlewares, and every other request through them as usual."""

    lean_front: LeanFront | None = None

    def serve_lean(self, route: LeanRoute, limit: int) -> LeanFront:
        """Serve ``route`` from the outside in, refusing bodies over ``limit`` bytes."""
        self.lean_front = LeanFront(self, route, limit)
        return self.lean_front

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        front = self.lean_front
        if front is not None and front.takes(scope):
            await front(scope, receive, send)
            return
        await super().__call__(scope, receive, send)
