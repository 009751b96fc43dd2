"""Worker health: an event-loop lag monitor and a ``/health`` endpoint.

The endpoint runs in its own thread, so it still answers -- with 503 -- while the
event loop is blocked; an endpoint on the loop itself would simply hang.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping

from fairlane.runtime.http import QuietHandler, ThreadedServer

__all__ = ["HealthServer", "LoopMonitor"]

_TICK = 0.1


class LoopMonitor:
    """Records when the event loop last ran, to tell how long it has been blocked."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.last_beat = time.monotonic()
        self.worst_lag = 0.0

    async def run(self, closed: asyncio.Event) -> None:
        while not closed.is_set():
            before = time.monotonic()
            try:
                async with asyncio.timeout(_TICK):
                    await closed.wait()
            except TimeoutError:
                pass
            now = time.monotonic()
            self.worst_lag = max(self.worst_lag, now - before - _TICK)
            self.last_beat = now

    def lag(self) -> float:
        return max(0.0, time.monotonic() - self.last_beat - _TICK)

    def healthy(self) -> bool:
        return self.lag() <= self.threshold


class HealthServer(ThreadedServer):
    """Serves ``GET /health``: 200 while the loop is responsive, 503 when it has been blocked."""

    def __init__(
        self,
        port: int,
        monitor: LoopMonitor,
        host: str = "127.0.0.1",
        details: Callable[[], Mapping[str, object]] | None = None,
    ) -> None:
        class Handler(QuietHandler):
            def do_GET(self) -> None:  # noqa: N802 - the standard library calls it so
                if self.path.rstrip("/") != "/health":
                    self.send_error(404)
                    return
                ok = monitor.healthy()
                state: dict[str, object] = {"ok": ok, "loop_lag_seconds": round(monitor.lag(), 3)}
                if details is not None:  # e.g. the worker's resource pressure
                    state.update(details())
                body = json.dumps(state)
                self.reply(200 if ok else 503, body.encode(), "application/json")

        super().__init__(host, port, Handler, "fairlane-health")
