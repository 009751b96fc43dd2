"""``RedisServer``: a private Redis/Valkey server process for one test run.

It never touches the shared per-user dev server of :mod:`fairlane.devserver`: each
instance listens on its own free TCP port on 127.0.0.1 with its own temporary
directory, and can be restarted on the same port and directory (keeping its AOF data
when ``appendonly`` is on) or killed with SIGKILL, for fault tests. Every wait is
bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from fairlane.devserver import ServerStartError, find_server_binary, ping
from fairlane.testing.process import (
    HOST,
    PORT_ATTEMPTS,
    STOP_TIMEOUT,
    ServerProcess,
    free_port,
)

__all__ = ["RedisServer"]


class RedisServer(ServerProcess):
    """A private Redis/Valkey server process for tests.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.  ``binary`` defaults to
    :func:`fairlane.devserver.find_server_binary`; ``port`` defaults to a free port;
    ``extra_args`` are appended to the command line and override the defaults (for example
    ``["--appendfsync", "always"]``).
    """

    def __init__(
        self,
        binary: str | None = None,
        *,
        port: int | None = None,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        start_timeout: float = 10.0,
    ) -> None:
        super().__init__(binary, start_timeout)
        self._fixed_port = port
        self._port = port
        self._appendonly = appendonly
        self._extra_args = tuple(extra_args)

    # ------------------------------------------------------------------ properties

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://{HOST}:{self.port}/0"

    @property
    def pid(self) -> int:
        """Pid of the current (or last) server process."""
        if self._proc is None:
            raise RuntimeError("RedisServer has not been started")
        return self._proc.pid

    @property
    def directory(self) -> Path:
        """The temporary working directory (data, AOF and ``server.log``)."""
        if self._dir is None:
            raise RuntimeError("RedisServer has not been started")
        return self._dir

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        """Create a temporary directory and start the server in it; wait until it answers."""
        if self.running:
            raise RuntimeError("RedisServer is already running")
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="fairlane-test-"))
        binary = find_server_binary(self._binary_name)
        try:
            self._launch(binary, keep_port=self._fixed_port is not None)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server (SIGTERM, SIGKILL after a bounded wait) and delete its directory."""
        self._discard()
        if self._fixed_port is None:
            self._port = None

    def restart(self) -> None:
        """Stop (gracefully) and start again on the same port and in the same directory."""
        if self._dir is None:
            raise RuntimeError("RedisServer has not been started")
        self._terminate()
        self._launch(find_server_binary(self._binary_name), keep_port=True)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would; the directory is kept for :meth:`restart`."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=STOP_TIMEOUT)
        self._close_log()

    def __repr__(self) -> str:
        state = f"port={self._port} pid={self._proc.pid}" if self.running and self._proc else ""
        return f"<RedisServer {'running ' + state if state else 'stopped'}>"

    # ------------------------------------------------------------------ internals

    def _args(self, binary: Path, port: int, directory: Path) -> list[str]:
        return [
            os.fspath(binary),
            "--port", str(port),
            "--bind", HOST,
            "--dir", os.fspath(directory),
            "--save", "",
            "--appendonly", "yes" if self._appendonly else "no",
            "--appendfsync", "everysec",
            "--maxmemory-policy", "noeviction",
            "--daemonize", "no",
            "--enable-debug-command", "local",
            *self._extra_args,
        ]  # fmt: skip

    def _launch(self, binary: Path, *, keep_port: bool) -> None:
        directory = self.directory
        deadline = time.monotonic() + self._start_timeout
        attempts = 1 if keep_port else PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            port = self._port if keep_port and self._port is not None else free_port()
            self._port = port
            proc = self._spawn(self._args(binary, port, directory), directory)
            if self._wait_until_up(proc, port, deadline):
                return
            self._terminate()
            if attempt == attempts or time.monotonic() >= deadline:
                break
        raise ServerStartError(
            f"{binary} did not start on {HOST}:{self._port}; log {directory / 'server.log'}:\n"
            f"{self._log_tail()}"
        )

    @staticmethod
    def _wait_until_up(proc: subprocess.Popen[bytes], port: int, deadline: float) -> bool:
        delay = 0.005
        while proc.poll() is None:
            if ping((HOST, port), timeout=0.5) == "+PONG":
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        return False
