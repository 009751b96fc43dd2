"""Helpers for testing code that uses Fairlane: private, throw-away Redis/Valkey servers.

This module owns :class:`RedisServer`, a server process private to one test run.  It never
touches the shared per-user dev server of :mod:`fairlane.store.server`: each instance listens on
its own free TCP port on 127.0.0.1 with its own temporary directory, and can be restarted on the
same port and directory (keeping its AOF data when ``appendonly`` is on) or killed with SIGKILL,
for fault tests.  Every wait is bounded.

Example::

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from fairlane.store.server import ServerStartError, find_server_binary, ping

__all__ = ["RedisServer", "ServerStartError"]

_HOST = "127.0.0.1"
_PORT_ATTEMPTS = 5
_STOP_TIMEOUT = 10.0


def _free_port() -> int:
    """A TCP port that was free a moment ago (bind to port 0, then release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
    return port


class RedisServer:
    """A private Redis/Valkey server process for tests.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.  ``binary`` defaults to
    :func:`fairlane.store.server.find_server_binary`; ``port`` defaults to a free port;
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
        self._binary_name = binary
        self._fixed_port = port
        self._port: int | None = port
        self._appendonly = appendonly
        self._extra_args = tuple(extra_args)
        self._start_timeout = start_timeout
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    # ------------------------------------------------------------------ properties

    @property
    def host(self) -> str:
        return _HOST

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("RedisServer has not been started")
        return self._port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://{_HOST}:{self.port}/0"

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
        self._terminate()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
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
            proc.wait(timeout=_STOP_TIMEOUT)
        self._close_log()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"port={self._port} pid={self._proc.pid}" if self.running and self._proc else ""
        return f"<RedisServer {'running ' + state if state else 'stopped'}>"

    # ------------------------------------------------------------------ internals

    def _args(self, binary: Path, port: int, directory: Path) -> list[str]:
        return [
            os.fspath(binary),
            "--port", str(port),
            "--bind", _HOST,
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
        attempts = 1 if keep_port else _PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            port = self._port if keep_port and self._port is not None else _free_port()
            self._port = port
            self._log = open(directory / "server.log", "ab")  # noqa: SIM115 - closed in stop
            self._proc = subprocess.Popen(
                self._args(binary, port, directory),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                cwd=directory,
            )
            if self._wait_until_up(self._proc, port, deadline):
                return
            self._terminate()
            if attempt == attempts or time.monotonic() >= deadline:
                break
        raise ServerStartError(
            f"{binary} did not start on {_HOST}:{self._port}; log {directory / 'server.log'}:\n"
            f"{self._log_tail()}"
        )

    @staticmethod
    def _wait_until_up(proc: subprocess.Popen[bytes], port: int, deadline: float) -> bool:
        delay = 0.005
        while proc.poll() is None:
            if ping((_HOST, port), timeout=0.5) == "+PONG":
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        return False

    def _terminate(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=_STOP_TIMEOUT)
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def _log_tail(self, lines: int = 20) -> str:
        if self._dir is None:
            return "(no log)"
        try:
            text = (self._dir / "server.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"
