"""Shared pieces of the dashboard tests: an app with a workload, a live gateway server.

``served`` runs the real gateway (``create_app``, dashboard mounted) under uvicorn in
a thread of its own, on a free port, with an ``App`` of its own connected in that
thread's loop; the test's loop keeps the app it enqueues with and runs workers on.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
import uvicorn

from fairlane import App
from fairlane.gateway import create_app
from tests.gateway.helpers import ADMIN_KEY, build_app

__all__ = ["ADMIN", "ADMIN_KEY", "Served", "client", "served", "ui_app"]

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def ui_app(namespace: str, redis_url: str) -> App:
    """The gateway tests' app, plus a task on a lane no test worker serves (its jobs
    stay queued) and one that holds a throttle key (its second job waits on it)."""
    app = build_app(namespace, redis_url)

    @app.task(gateway=True, name="later", lane="parked", attempts=1)
    async def later(n: int) -> int:
        return n

    @app.task(gateway=True, name="hold", attempts=1, limits={"model:big": 1})
    async def hold(seconds: float) -> None:
        await asyncio.sleep(seconds)

    return app


@asynccontextmanager
async def client(
    namespace: str, redis_url: str, **options: Any
) -> AsyncIterator[tuple[App, httpx.AsyncClient]]:
    """The app connected, and a client of its gateway (``create_app(**options)``) that
    calls it in this loop (``httpx.ASGITransport``)."""
    app = ui_app(namespace, redis_url)
    async with app:
        api = create_app(app, admin_key=ADMIN_KEY, **options)
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
            yield app, http


class Served:
    def __init__(self, base: str, server: uvicorn.Server, thread: threading.Thread) -> None:
        self.base = base
        self.server = server
        self.thread = thread


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def served(namespace: str, redis_url: str, **options: Any) -> Iterator[Served]:
    """A running gateway for ``namespace`` at ``Served.base`` (``http://127.0.0.1:<port>``)."""
    api = create_app(ui_app(namespace, redis_url), admin_key=ADMIN_KEY, **options)
    port = _free_port()
    config = uvicorn.Config(
        api, host="127.0.0.1", port=port, log_level="warning", ws="none", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="ui-gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the gateway did not start")
        time.sleep(0.02)
    try:
        yield Served(f"http://127.0.0.1:{port}", server, thread)
    finally:
        server.should_exit = True
        thread.join(10)
