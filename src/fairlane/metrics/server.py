"""``MetricsServer``: serves ``GET /metrics`` (Prometheus text) and ``GET /autoscale`` (JSON).

Like the health endpoint it runs in a thread of its own, so a scrape never waits on
the worker's event loop and never slows it: worker-side values are read from the
registry under prometheus_client's own locks, store-side values by a ``StoreReader``
with its own connection.
"""

from __future__ import annotations

import json

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from fairlane.metrics.store import StoreReader, autoscale_view
from fairlane.runtime.http import QuietHandler, ThreadedServer

__all__ = ["MetricsServer"]


class MetricsServer(ThreadedServer):
    """The worker's metrics endpoint; port 0 binds a free port (see ``port``)."""

    def __init__(
        self,
        port: int,
        registry: CollectorRegistry,
        reader: StoreReader | None,
        host: str = "0.0.0.0",
    ) -> None:
        class Handler(QuietHandler):
            def do_GET(self) -> None:  # noqa: N802 - the standard library calls it so
                path = self.path.split("?", 1)[0].rstrip("/")
                if path == "/metrics":
                    self.reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path == "/autoscale":
                    snap = reader.snapshot() if reader is not None else None
                    body = json.dumps(autoscale_view(snap)).encode()
                    self.reply(200, body, "application/json")
                else:
                    self.send_error(404)

        super().__init__(host, port, Handler, "fairlane-metrics")
