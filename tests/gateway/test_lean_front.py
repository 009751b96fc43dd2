"""``LeanApi``: ``POST /v1/jobs`` answered before the framework's layers, doing their part.

Driven over raw ASGI, so that a body can arrive in chunks without a length, a client
can leave halfway, and an error can escape: what an HTTP client library never sends.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pytest

from fairlane.gateway import ApiKeys, create_app
from fairlane.gateway.lean import LeanApi
from tests.gateway.helpers import build_app

pytestmark = [pytest.mark.anyio, pytest.mark.embedded_only]

LIMIT = 2000


def _scope(key: str, *, length: int | None, path: str = "/v1/jobs") -> dict[str, Any]:
    headers = [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "server": ("gw", 80),
        "client": ("127.0.0.1", 1),
    }


async def _call(
    api: LeanApi,
    key: str,
    messages: Iterable[dict[str, Any]],
    *,
    length: int | None = None,
    path: str = "/v1/jobs",
) -> list[dict[str, Any]]:
    pending = list(messages)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await api(_scope(key, length=length, path=path), receive, send)
    return sent


def _chunks(body: bytes, size: int) -> list[dict[str, Any]]:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return [
        {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
        for i, part in enumerate(parts)
    ]


async def test_chunks_over_the_limit_without_a_length_get_413(
    redis_url: str, namespace: str
) -> None:
    app = build_app(namespace, redis_url)
    async with app:
        api = create_app(app, max_body_bytes=LIMIT)
        assert isinstance(api, LeanApi)
        key = (await ApiKeys(app.store.key_records).create("acme")).key
        small = json.dumps({"task": "echo", "args": ["hi"]}).encode()
        sent = await _call(api, key, _chunks(small, 7))
        assert sent[0]["status"] == 202, sent
        big = json.dumps({"task": "echo", "args": ["x" * LIMIT]}).encode()
        sent = await _call(api, key, _chunks(big, 500))
        assert sent[0]["status"] == 413
        assert json.loads(sent[1]["body"])["reason"] == "too_large"


async def test_other_routes_keep_the_body_limit_middleware(redis_url: str, namespace: str) -> None:
    # the same limit, read by the same function, on a route the framework serves
    app = build_app(namespace, redis_url)
    async with app:
        api = create_app(app, max_body_bytes=LIMIT)
        key = (await ApiKeys(app.store.key_records).create("acme")).key
        big = json.dumps({"payload": "x" * LIMIT}).encode()
        sent = await _call(api, key, _chunks(big, 500), path="/v1/runs/r1/signals/go")
        assert sent[0]["status"] == 413
        assert json.loads(sent[1]["body"])["reason"] == "too_large"


async def test_a_client_that_leaves_mid_body_is_not_answered(
    redis_url: str, namespace: str
) -> None:
    app = build_app(namespace, redis_url)
    async with app:
        api = create_app(app)
        key = (await ApiKeys(app.store.key_records).create("acme")).key
        body = json.dumps({"task": "echo", "args": ["hi"]}).encode()
        # the first half arrives, then the client is gone: nothing is sent, nothing stored
        first = {"type": "http.request", "body": body[: len(body) // 2], "more_body": True}
        assert await _call(api, key, [first]) == []
        jobs = [k async for k in app.store.client.scan_iter(match=app.store.keys.job("*"))]
        assert jobs == []


async def test_an_error_escaping_the_handler_is_a_500(redis_url: str, namespace: str) -> None:
    app = build_app(namespace, redis_url)
    async with app:
        api = create_app(app)
        key = (await ApiKeys(app.store.key_records).create("acme")).key
        seen: list[tuple[str, int]] = []
        front = api.lean_front
        assert front is not None
        observe = front.observe
        assert observe is not None

        def observed(method: str, route: str, status: int, seconds: float, body: Any) -> None:
            seen.append((route, status))
            observe(method, route, status, seconds, body)

        async def broken(*_: Any) -> Any:
            raise RuntimeError("a bug")

        front.observe, front.handler = observed, broken
        body = json.dumps({"task": "echo"}).encode()
        with pytest.raises(RuntimeError, match="a bug"):
            await _call(api, key, [{"type": "http.request", "body": body}])
        assert seen == [("/v1/jobs", 500)]
