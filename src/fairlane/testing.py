"""Helpers for testing code that uses Fairlane: private, throw-away Redis/Valkey servers.

This module owns :class:`RedisServer`, a server process private to one test run.  It never
touches the shared per-user dev server of :mod:`fairlane.store.server`: each instance listens on
its own free TCP port on 127.0.0.1 with its own temporary directory, and can be restarted on the
same port and directory (keeping its AOF data when ``appendonly`` is on) or killed with SIGKILL,
for fault tests.  Every wait is bounded.

It also owns :class:`RedisCluster`, a private Redis Cluster of several such servers (slots
assigned and nodes joined by this module, no cluster CLI), and :class:`RedisSentinel`, a
Sentinel process monitoring one of them; both start from the same server binary.

Example::

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
"""

from __future__ import annotations

import contextlib
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
from typing import IO, Any, Self

import redis

from fairlane.store.connection import cluster_url, sentinel_url
from fairlane.store.server import ServerStartError, find_server_binary, ping

__all__ = ["RedisCluster", "RedisSentinel", "RedisServer", "ServerStartError"]

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
        _stop_process(self._proc)
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def _log_tail(self, lines: int = 20) -> str:
        return _tail(self._dir, "server.log", lines)


def _stop_process(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM, a bounded wait, then SIGKILL: a server process of this module's."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=_STOP_TIMEOUT)


def _tail(directory: Path | None, name: str, lines: int) -> str:
    """The last ``lines`` of a server's log, for an error message."""
    if directory is None:
        return "(no log)"
    try:
        text = (directory / name).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


# ---------------------------------------------------------------------------- Redis Cluster

_CLUSTER_SLOTS = 16384
_NODE_ATTEMPTS = 5


def _command(client: redis.Redis, *args: str | int) -> Any:
    """A raw command (redis-py leaves ``execute_command`` unannotated)."""
    run: Any = client.execute_command
    return run(*args)


def _cluster_info(client: redis.Redis) -> dict[str, str]:
    text = _command(client, "CLUSTER", "INFO")
    raw = text.decode() if isinstance(text, bytes) else str(text)
    return dict(line.split(":", 1) for line in raw.split() if ":" in line)


class RedisCluster:
    """A private Redis Cluster of ``masters`` primaries (no replicas) for tests.

    Each primary is a :class:`RedisServer` of the same binary, with ``cluster-enabled yes``
    on its own port, cluster-bus port and directory. The slots are split evenly with
    ``CLUSTER ADDSLOTSRANGE`` and the nodes joined with ``CLUSTER MEET``, so no cluster CLI
    is needed; :meth:`start` returns once every node reports ``cluster_state:ok`` and
    knows every other. ``url`` is a ``redis+cluster://`` URL naming all the nodes.
    """

    def __init__(
        self,
        binary: str | None = None,
        *,
        masters: int = 3,
        extra_args: Sequence[str] = (),
        start_timeout: float = 30.0,
        node_timeout_ms: int = 5000,
    ) -> None:
        if masters < 1:
            raise ValueError("a cluster needs at least one master")
        self._binary_name = binary
        self._masters = masters
        self._extra_args = tuple(extra_args)
        self._start_timeout = start_timeout
        self._node_timeout_ms = node_timeout_ms
        self._servers: list[RedisServer] = []
        self._bus_ports: list[int] = []

    @property
    def servers(self) -> list[RedisServer]:
        """The primaries, in slot order (the first holds slot 0)."""
        if not self._servers:
            raise RuntimeError("RedisCluster has not been started")
        return list(self._servers)

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every primary."""
        return [(s.host, s.port) for s in self.servers]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,.../`` (``fairlane.store.connection``)."""
        return cluster_url(self.startup_nodes)

    def start(self) -> Self:
        if self._servers:
            raise RuntimeError("RedisCluster is already running")
        deadline = time.monotonic() + self._start_timeout
        try:
            for _ in range(self._masters):
                self._start_node(deadline)
            self._form(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node and delete their directories."""
        servers, self._servers, self._bus_ports = self._servers, [], []
        for server in servers:
            server.stop()

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
        ports = ",".join(str(s.port) for s in self._servers)
        return f"<RedisCluster {'ports ' + ports if ports else 'stopped'}>"

    def _start_node(self, deadline: float) -> None:
        # The bus port is picked before the server binds it, so a collision is possible;
        # a node that fails to start is retried on fresh ports.
        for attempt in range(1, _NODE_ATTEMPTS + 1):
            bus = _free_port()
            args = [
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-port", str(bus),
                "--cluster-node-timeout", str(self._node_timeout_ms),
                *self._extra_args,
            ]  # fmt: skip
            server = RedisServer(
                self._binary_name,
                extra_args=args,
                start_timeout=max(1.0, deadline - time.monotonic()),
            )
            try:
                server.start()
            except ServerStartError:
                if attempt == _NODE_ATTEMPTS or time.monotonic() >= deadline:
                    raise
                continue
            self._servers.append(server)
            self._bus_ports.append(bus)
            return

    def _form(self, deadline: float) -> None:
        clients = [redis.Redis(host=s.host, port=s.port, socket_timeout=5.0) for s in self._servers]
        try:
            n = len(clients)
            for i, client in enumerate(clients):
                first, last = i * _CLUSTER_SLOTS // n, (i + 1) * _CLUSTER_SLOTS // n - 1
                _command(client, "CLUSTER", "ADDSLOTSRANGE", first, last)
                # distinct epochs spare the nodes a round of collision handling
                _command(client, "CLUSTER", "SET-CONFIG-EPOCH", i + 1)
            for server, bus in zip(self._servers[1:], self._bus_ports[1:], strict=True):
                _command(clients[0], "CLUSTER", "MEET", server.host, server.port, bus)
            self._wait_formed(clients, deadline)
        finally:
            for client in clients:
                client.close()

    def _wait_formed(self, clients: list[redis.Redis], deadline: float) -> None:
        delay = 0.02
        while True:
            infos = [_cluster_info(c) for c in clients]
            if all(
                info.get("cluster_state") == "ok"
                and info.get("cluster_known_nodes") == str(len(clients))
                and info.get("cluster_slots_ok") == str(_CLUSTER_SLOTS)
                for info in infos
            ):
                return
            if time.monotonic() >= deadline:
                raise ServerStartError(f"the cluster did not form in time: {infos}")
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


# ---------------------------------------------------------------------------- Sentinel


class RedisSentinel:
    """A private Sentinel process, from the same binary, monitoring one server.

    ``master`` is the server to monitor (a running :class:`RedisServer`, or ``(host,
    port)``); it is named ``service_name``. :meth:`start` returns once the sentinel answers
    ``SENTINEL GET-MASTER-ADDR-BY-NAME`` with the master's address. ``url`` is the
    ``redis+sentinel://`` URL of that service. ``down_after_ms`` is how long the master
    must be silent before the sentinel (its own quorum) fails over to a replica.
    """

    def __init__(
        self,
        master: RedisServer | tuple[str, int],
        *,
        service_name: str = "fairlane",
        binary: str | None = None,
        start_timeout: float = 10.0,
        down_after_ms: int = 5000,
    ) -> None:
        self._master = master
        self.service_name = service_name
        self._down_after_ms = down_after_ms
        self._binary_name = binary
        self._start_timeout = start_timeout
        self._port: int | None = None
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def host(self) -> str:
        return _HOST

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("RedisSentinel has not been started")
        return self._port

    @property
    def url(self) -> str:
        """``redis+sentinel://127.0.0.1:PORT/<service_name>/0``."""
        return sentinel_url([(_HOST, self.port)], self.service_name)

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
            for attempt in range(1, _PORT_ATTEMPTS + 1):
                self._port = _free_port()
                if self._launch(binary, deadline):
                    return self
                self._terminate()
                if attempt == _PORT_ATTEMPTS or time.monotonic() >= deadline:
                    break
            raise ServerStartError(
                f"sentinel did not start; log {self._dir / 'sentinel.log'}:\n{self._log_tail()}"
            )
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self._terminate()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._port = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _launch(self, binary: Path, deadline: float) -> bool:
        assert self._dir is not None
        host, port = self._master_address()
        conf = self._dir / "sentinel.conf"
        # Sentinel rewrites its config file as it learns, so it must be a file of its own.
        conf.write_text(
            f"port {self.port}\n"
            f"bind {_HOST}\n"
            f"dir {self._dir}\n"
            f"sentinel monitor {self.service_name} {host} {port} 1\n"
            f"sentinel down-after-milliseconds {self.service_name} {self._down_after_ms}\n"
            f"sentinel failover-timeout {self.service_name} {max(3 * self._down_after_ms, 1000)}\n"
        )
        self._log = open(self._dir / "sentinel.log", "ab")  # noqa: SIM115 - closed in stop
        self._proc = subprocess.Popen(
            [os.fspath(binary), os.fspath(conf), "--sentinel"],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self._dir,
        )
        client = redis.Redis(host=_HOST, port=self.port, socket_timeout=1.0)
        delay = 0.01
        try:
            while self._proc.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(redis.RedisError):
                    reply = _command(
                        client, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name
                    )
                    if reply and (_s(reply[0]), int(reply[1])) == (host, port):
                        return True
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
        finally:
            client.close()
        return False

    def _terminate(self) -> None:
        _stop_process(self._proc)
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def _log_tail(self, lines: int = 20) -> str:
        return _tail(self._dir, "sentinel.log", lines)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
