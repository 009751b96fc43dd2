"""A worker's ``GET /health`` endpoint over its loop monitor (``runtime/health.py``).

Apart from the monitor, which every worker runs, because the HTTP server it stands on
(``http.server``) is imported only by a worker given a health port.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from fairlane.runtime.health import LoopMonitor
from fairlane.runtime.http import QuietHandler, ThreadedServer

__all__ = ["HealthServer"]


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
