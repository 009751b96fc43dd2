"""What every private server process of ``fairlane.testing`` shares: a free port on the
loopback address, a temporary directory with its log, a bounded stop, and use as a
context manager."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, ClassVar, Self

import redis

__all__ = [
    "HOST",
    "PORT_ATTEMPTS",
    "STOP_TIMEOUT",
    "Managed",
    "ServerProcess",
    "command",
    "free_port",
    "stop_process",
    "tail",
    "text",
]

HOST = "127.0.0.1"
PORT_ATTEMPTS = 5
STOP_TIMEOUT = 10.0


def free_port() -> int:
    """A TCP port that was free a moment ago (bind to port 0, then release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
    return port


def stop_process(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM, a bounded wait, then SIGKILL: a server process of this package's."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)


def tail(directory: Path | None, name: str, lines: int) -> str:
    """The last ``lines`` of a server's log, for an error message."""
    if directory is None:
        return "(no log)"
    try:
        content = (directory / name).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(content.splitlines()[-lines:]) or "(empty log)"


def command(client: redis.Redis, *args: str | int) -> Any:
    """A raw command (redis-py leaves ``execute_command`` unannotated)."""
    run: Any = client.execute_command
    return run(*args)


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Managed:
    """Started on entering a ``with`` block, stopped on leaving it, however it is left."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ServerProcess(Managed):
    """One server process: its port on ``HOST``, its temporary directory and its log
    there (``log_name``), started from the server binary ``binary`` names."""

    log_name: ClassVar[str] = "server.log"

    def __init__(self, binary: str | None, start_timeout: float) -> None:
        self._binary_name = binary
        self._start_timeout = start_timeout
        self._port: int | None = None
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} has not been started")
        return self._port

    def _spawn(self, args: Sequence[str], directory: Path) -> subprocess.Popen[bytes]:
        """Start the process in ``directory``, its output appended to its log there."""
        self._log = open(directory / self.log_name, "ab")  # noqa: SIM115 - closed in stop
        self._proc = subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=directory,
        )
        return self._proc

    def _terminate(self) -> None:
        stop_process(self._proc)
        self._close_log()

    def _discard(self) -> None:
        """Stop the process and delete its directory."""
        self._terminate()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def _log_tail(self, lines: int = 20) -> str:
        return tail(self._dir, self.log_name, lines)
