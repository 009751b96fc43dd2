"""``RedisSentinel``: a private Sentinel process, from the same binary, watching one server.

It monitors a :class:`~fairlane.testing.RedisServer` (or any ``(host, port)``) under a
service name of its own and fails over to a replica when the master is silent for
``down_after_ms``; ``url`` is the ``redis+sentinel://`` URL clients connect with.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import ClassVar, Self

import redis

from fairlane.devserver import ServerStartError, find_server_binary
from fairlane.store.connection import sentinel_url
from fairlane.testing.process import (
    HOST,
    PORT_ATTEMPTS,
    ServerProcess,
    command,
    free_port,
    text,
)
from fairlane.testing.server import RedisServer

__all__ = ["RedisSentinel"]


class RedisSentinel(ServerProcess):
    """A private Sentinel process, from the same binary, monitoring one server.

    ``master`` is the server to monitor (a running :class:`RedisServer`, or ``(host,
    port)``); it is named ``service_name``. :meth:`start` returns once the sentinel answers
    ``SENTINEL GET-MASTER-ADDR-BY-NAME`` with the master's address. ``url`` is the
    ``redis+sentinel://`` URL of that service. ``down_after_ms`` is how long the master
    must be silent before the sentinel (its own quorum) fails over to a replica.
    """

    log_name: ClassVar[str] = "sentinel.log"

    def __init__(
        self,
        master: RedisServer | tuple[str, int],
        *,
        service_name: str = "fairlane",
        binary: str | None = None,
        start_timeout: float = 10.0,
        down_after_ms: int = 5000,
    ) -> None:
        super().__init__(binary, start_timeout)
        self._master = master
        self.service_name = service_name
        self._down_after_ms = down_after_ms

    @property
    def url(self) -> str:
        """``redis+sentinel://127.0.0.1:PORT/<service_name>/0``."""
        return sentinel_url([(HOST, self.port)], self.service_name)

    def _master_address(self) -> tuple[str, int]:
        if isinstance(self._master, RedisServer):
            return self._master.host, self._master.port
        return self._master

    def start(self) -> Self:
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError("RedisSentinel is already running")
        self._dir = Path(tempfile.mkdtemp(prefix="fairlane-sentinel-"))
        binary = find_server_binary(self._binary_name)
        deadline = time.monotonic() + self._start_timeout
        try:
            for attempt in range(1, PORT_ATTEMPTS + 1):
                self._port = free_port()
                if self._launch(binary, deadline):
                    return self
                self._terminate()
                if attempt == PORT_ATTEMPTS or time.monotonic() >= deadline:
                    break
            raise ServerStartError(
                f"sentinel did not start; log {self._dir / self.log_name}:\n{self._log_tail()}"
            )
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self._discard()
        self._port = None

    def _launch(self, binary: Path, deadline: float) -> bool:
        assert self._dir is not None
        host, port = self._master_address()
        conf = self._dir / "sentinel.conf"
        # Sentinel rewrites its config file as it learns, so it must be a file of its own.
        conf.write_text(
            f"port {self.port}\n"
            f"bind {HOST}\n"
            f"dir {self._dir}\n"
            f"sentinel monitor {self.service_name} {host} {port} 1\n"
            f"sentinel down-after-milliseconds {self.service_name} {self._down_after_ms}\n"
            f"sentinel failover-timeout {self.service_name} {max(3 * self._down_after_ms, 1000)}\n"
        )
        proc = self._spawn([os.fspath(binary), os.fspath(conf), "--sentinel"], self._dir)
        client = redis.Redis(host=HOST, port=self.port, socket_timeout=1.0)
        delay = 0.01
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(redis.RedisError):
                    reply = command(
                        client, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name
                    )
                    if reply and (text(reply[0]), int(reply[1])) == (host, port):
                        return True
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
        finally:
            client.close()
        return False
