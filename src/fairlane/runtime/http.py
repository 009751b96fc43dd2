"""A small HTTP server on a thread of its own, for the worker's side endpoints.

The health and metrics endpoints must answer while the worker's event loop is busy
or blocked (that is what they report on), so each runs a standard-library threading
server outside the loop. This owns the server, its thread, and starting and stopping
them; subclasses give the request handler.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["QuietHandler", "ThreadedServer"]


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that keeps the worker's log free of one line per request."""

    def log_message(self, format: str, *args: object) -> None:
        return

    def reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class ThreadedServer:
    """Serves ``handler`` on ``host:port`` from a daemon thread; port 0 binds a free one."""

    def __init__(
        self, host: str, port: int, handler: type[BaseHTTPRequestHandler], name: str
    ) -> None:
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
