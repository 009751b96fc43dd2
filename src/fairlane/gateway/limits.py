"""The gateway's request-body size limit, enforced before anything parses the body."""

from __future__ import annotations

import json

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodyLimit", "TooLarge", "read_within", "too_large"]


class TooLarge(Exception):
    """A request's body is over the limit."""


async def read_within(scope: Scope, receive: Receive, limit: int) -> bytes | Message:
    """A request's whole body, or ``TooLarge`` once it is over ``limit`` bytes: by its
    ``Content-Length`` first, then by the bytes actually received (a chunked body has
    none), holding at most ``limit`` of them. A message other than the body's (the
    client left) is returned as it came."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise TooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return message
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def too_large(limit: int) -> Response:
    """The answer to a body over ``limit`` bytes."""
    body = json.dumps(
        {"detail": f"the request body is over {limit} bytes", "reason": "too_large"}
    ).encode()
    return Response(body, 413, media_type="application/json")


class BodyLimit:
    """Refuses a request whose body is over ``limit`` bytes with 413 (``read_within``)
    before the app sees it, and hands the app the body it read."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            read = await read_within(scope, receive, self.limit)
        except TooLarge:
            await too_large(self.limit)(scope, receive, send)
            return
        if isinstance(read, bytes):
            read = {"type": "http.request", "body": read, "more_body": False}
        await self.app(scope, _replay([read], receive), send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
