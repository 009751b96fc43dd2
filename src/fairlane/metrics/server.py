"""``MetricsServer``: serves ``GET /metrics`` (Prometheus text) and ``GET /autoscale`` (JSON).

Like the health endpoint it runs in a thread of its own, so a scrape never waits on
the worker's event loop and never slows it: worker-side values are read from the
registry under prometheus_client's own locks, store-side values by a ``StoreReader``
with its own connection.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from fairlane.metrics.store import StoreReader, autoscale_view

__all__ = ["MetricsServer"]


class MetricsServer:
    """The worker's metrics endpoint; port 0 binds a free port (see ``port``)."""

    def __init__(
        self,
        port: int,
        registry: CollectorRegistry,
        reader: StoreReader | None,
        host: str = "0.0.0.0",
    ) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0].rstrip("/")
                if path == "/metrics":
                    body, kind = generate_latest(registry), CONTENT_TYPE_LATEST
                elif path == "/autoscale":
                    snap = reader.snapshot() if reader is not None else None
                    body, kind = json.dumps(autoscale_view(snap)).encode(), "application/json"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fairlane-metrics", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
