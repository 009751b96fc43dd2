"""The gateway's request-body size limit, enforced before anything parses the body."""

from __future__ import annotations

import json

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodyLimit", "too_large"]


def too_large(limit: int) -> Response:
    """The answer to a body over ``limit`` bytes."""
    body = json.dumps(
        {"detail": f"the request body is over {limit} bytes", "reason": "too_large"}
    ).encode()
    return Response(body, 413, media_type="application/json")


class BodyLimit:
    """Refuses a request whose body is over ``limit`` bytes with 413.

    Checks ``Content-Length`` first, then counts the bytes actually received (a chunked
    body has no length), buffering at most ``limit`` bytes before handing them on.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.limit:
                    await self._refuse(scope, receive, send)
                    return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message], receive), send)
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit:
                await self._refuse(scope, receive, send)
                return
            chunks.append(body)
            more = message.get("more_body", False)
        whole: Message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([whole], receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await too_large(self.limit)(scope, receive, send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
