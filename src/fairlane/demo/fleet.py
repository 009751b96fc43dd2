"""The demo's processes: a private server, one worker process per lane, and their cleanup.

This module owns every process the demo starts and every key it leaves, and makes sure
none outlives it:

* :class:`PrivateServer` starts a server of the demo's own (the dev-server helper of
  :mod:`fairlane.devserver`, in a private state directory: it runs in its own session,
  so a Ctrl-C in the terminal reaches the demo, which stops it last) and stops it;
* :class:`Fleet` runs ``fairlane worker fairlane.demo.app:app --lanes <lane>`` for the
  lanes ``light`` and ``heavy`` as real subprocesses (with ``--metrics-port`` when the
  demo was given one), and with ``--dashboard-port`` a ``fairlane gateway`` for the same
  app, in their own process group (the demo, not the terminal, decides when they
  stop), each logging to a file; it stops them with SIGTERM (a graceful drain), waits a
  bounded time, then SIGKILLs;
* :class:`Cleanup` is the synchronous last line of defence, run whatever happened (an
  error, a second Ctrl-C): it kills any worker or gateway still alive, deletes the keys
  of every app the demo used, and stops the private server.

The gateway is a process of its own rather than a thread of the demo's, so that serving
the dashboard and its scrapes takes nothing from the loop that submits the workload on
time, and so that it is stopped exactly as the workers are. Its session cookies are
signed with a secret derived from the admin key, so a browser logged in during the fair
run stays logged in to the next run's gateway on the same port.

Every wait here is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import redis

from fairlane.demo.app import APP_ENV, HEAVY_SLOTS, LIGHT_SLOTS, MODE_ENV, PARENT_ENV, Mode
from fairlane.devserver import ensure_dev_server, stop_dev_server
from fairlane.store.connection import create_sync_client
from fairlane.store.keys import AppKeys
from fairlane.store.keyspace import unlink_matching_sync
from fairlane.testing.process import Managed

__all__ = [
    "LANES",
    "Child",
    "Cleanup",
    "DemoError",
    "Fleet",
    "GatewayProcess",
    "GatewaySpec",
    "PrivateServer",
    "WorkerProcess",
    "check_ports",
]

#: the lanes the demo serves, with each one's worker slots
LANES: dict[str, int] = {"light": LIGHT_SLOTS, "heavy": HEAVY_SLOTS}
WORKER_APP = "fairlane.demo.app:app"
_STOP_SLACK = 5.0  # s beyond the workers' grace period before SIGKILL
_KILL_WAIT = 5.0
_GATEWAY_TIMEOUT = 30.0  # s for the gateway to import its web stack and listen
GATEWAY_HOST = "127.0.0.1"  # the dashboard holds admin powers: this machine only
ADMIN_KEY_ENV = "FAIRLANE_GATEWAY_ADMIN_KEY"


class DemoError(RuntimeError):
    """The demo cannot go on: a worker died, or the server or the fleet did not come up."""


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


class PrivateServer:
    """A server for the demo alone, in a temporary state directory; stopped on exit."""

    def __init__(self) -> None:
        self.state_dir: Path | None = None
        self.url: str | None = None

    def start(self) -> str:
        # short, so that the unix socket's path fits in sun_path on every platform
        self.state_dir = Path(tempfile.mkdtemp(prefix="fl-demo-"))
        self.url = ensure_dev_server(self.state_dir, timeout=20.0)
        return self.url

    def stop(self) -> None:
        if self.state_dir is None:
            return
        try:
            stop_dev_server(self.state_dir, timeout=10.0)
        finally:
            shutil.rmtree(self.state_dir, ignore_errors=True)
            self.state_dir = None


@dataclass
class ChildProcess:
    """A subprocess the demo started, and the file its output goes to."""

    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class WorkerProcess(ChildProcess):
    """One ``fairlane worker`` subprocess serving one lane."""

    lane: str = ""
    slots: int = 0


@dataclass
class GatewayProcess(ChildProcess):
    """The ``fairlane gateway`` subprocess serving one run's app on ``port``."""

    port: int = 0


#: a process the demo started and must stop
Child = WorkerProcess | GatewayProcess


@dataclass(frozen=True, slots=True)
class GatewaySpec:
    """Serve each run's app over HTTP (dashboard at ``/ui``, ``/metrics``) on ``port``."""

    port: int
    admin_key: str = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://{GATEWAY_HOST}:{self.port}"


@dataclass
class Cleanup(Managed):
    """What must not outlive the demo: worker and gateway processes, app keys, the
    private server; stopped on leaving a ``with`` block, however it is left."""

    url: str | None = None
    server: PrivateServer | None = None
    workers: list[Child] = field(default_factory=list)
    apps: list[str] = field(default_factory=list)
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fairlane-demo-")))

    def start(self) -> Self:
        return self  # nothing to start: the run hands it what it starts, as it goes

    def stop(self) -> None:
        """Kill live workers and gateways, delete every app's keys, stop the server;
        never raises."""
        kill_workers(self.workers)
        self.workers.clear()
        if self.url is not None and self.apps:
            with contextlib.suppress(redis.RedisError, OSError):
                delete_keys_sync(self.url, self.apps)
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.stop()
            self.server = None
        shutil.rmtree(self.log_dir, ignore_errors=True)


def kill_workers(workers: list[Child]) -> None:
    """SIGTERM, a short bounded wait, then SIGKILL, for every process still alive."""
    live = [w for w in workers if w.alive()]
    for w in live:
        with contextlib.suppress(ProcessLookupError):
            w.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _KILL_WAIT
    for w in live:
        try:
            w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=_KILL_WAIT)


def check_ports(ports: dict[int, str]) -> None:
    """Raise ``DemoError`` if a port the demo is to serve on is taken (``ports`` maps
    each to what it is for). Checked once before anything starts, so that a busy port
    is a clear message rather than a process dying mid-run; ``SO_REUSEADDR`` as the
    servers themselves set it, so a port still in TIME_WAIT counts as free."""
    for port, purpose in ports.items():
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("", port))
            except OSError as exc:
                raise DemoError(f"port {port} ({purpose}) is not free: {exc.strerror}") from None


def delete_keys_sync(url: str, apps: list[str]) -> int:
    """Delete every key of the named apps (SCAN, then UNLINK in batches)."""
    client = create_sync_client(url, socket_timeout=5.0, socket_connect_timeout=5.0)
    try:
        return sum(unlink_matching_sync(client, AppKeys.for_app(name).match_all()) for name in apps)
    finally:
        client.close()


class Fleet:
    """The processes of one run, for app ``name`` in ``mode``: a worker per lane (the
    ``i``-th lane's serving metrics on ``metrics_port + i`` when given), and a gateway
    when ``gateway`` is given."""

    def __init__(  # noqa: PLR0917 - the run's parts
        self,
        name: str,
        mode: Mode,
        url: str,
        cleanup: Cleanup,
        metrics_port: int | None = None,
        gateway: GatewaySpec | None = None,
    ) -> None:
        self.name = name
        self.mode = mode
        self.url = url
        self.cleanup = cleanup
        self.metrics_port = metrics_port
        self.gateway_spec = gateway
        self.workers: list[WorkerProcess] = []
        self.gateway: GatewayProcess | None = None

    @property
    def children(self) -> list[Child]:
        gateway: list[Child] = [self.gateway] if self.gateway is not None else []
        return [*self.workers, *gateway]

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRLANE_")}
        env.update(
            {
                APP_ENV: self.name,
                MODE_ENV: self.mode,
                PARENT_ENV: str(os.getpid()),
                "PYTHONUNBUFFERED": "1",
            }
        )
        return env

    def _spawn(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            return subprocess.Popen(
                argv,
                cwd=self.cleanup.log_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                # not the terminal's process group: a Ctrl-C reaches the demo alone,
                # which then stops its children in order
                process_group=0,
            )

    def start(self) -> None:
        env = self._env()
        for i, (lane, slots) in enumerate(LANES.items()):
            argv = [
                sys.executable,
                "-m",
                "fairlane.cli",
                "worker",
                WORKER_APP,
                "--lanes",
                lane,
                "--concurrency",
                str(slots),
                "--redis-url",
                self.url,
            ]
            if self.metrics_port is not None:
                argv += ["--metrics-port", str(self.metrics_port + i)]
            log = self.cleanup.log_dir / f"{self.name}-{lane}.log"
            worker = WorkerProcess(self._spawn(argv, env, log), log, lane=lane, slots=slots)
            self.workers.append(worker)
            self.cleanup.workers.append(worker)
        if self.gateway_spec is not None:
            self._start_gateway(self.gateway_spec, env)

    def _start_gateway(self, spec: GatewaySpec, env: dict[str, str]) -> None:
        argv = [
            sys.executable,
            "-m",
            "fairlane.cli",
            "gateway",
            WORKER_APP,
            "--host",
            GATEWAY_HOST,
            "--port",
            str(spec.port),
            "--redis-url",
            self.url,
            "--log-level",
            "warning",
        ]
        # the key travels in the environment, not on a command line anyone can list
        log = self.cleanup.log_dir / f"{self.name}-gateway.log"
        proc = self._spawn(argv, {**env, ADMIN_KEY_ENV: spec.admin_key}, log)
        self.gateway = GatewayProcess(proc, log, port=spec.port)
        self.cleanup.workers.append(self.gateway)

    async def wait_for_gateway(self) -> None:
        """Until the gateway accepts connections; ``DemoError`` if it exits or takes
        longer than a bounded time."""
        gateway = self.gateway
        if gateway is None:
            return
        deadline = time.monotonic() + _GATEWAY_TIMEOUT
        while True:
            self.check()
            try:
                async with asyncio.timeout(1.0):
                    _, writer = await asyncio.open_connection(GATEWAY_HOST, gateway.port)
            except (OSError, TimeoutError):
                if time.monotonic() >= deadline:
                    raise DemoError(
                        f"the gateway (pid {gateway.pid}) did not listen on port "
                        f"{gateway.port} within {_GATEWAY_TIMEOUT:g} s; its log:\n"
                        f"{_log_tail(gateway.log)}"
                    ) from None
                await asyncio.sleep(0.1)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return

    def check(self) -> None:
        """Raise ``DemoError`` (with the log's tail) if a worker or the gateway has exited."""
        for w in self.workers:
            code = w.proc.poll()
            if code is not None:
                raise DemoError(
                    f"the {w.lane} worker (pid {w.pid}) exited with code {code}; its log:\n"
                    f"{_log_tail(w.log)}"
                )
        if self.gateway is not None and (code := self.gateway.proc.poll()) is not None:
            raise DemoError(
                f"the gateway (pid {self.gateway.pid}) exited with code {code}; its log:\n"
                f"{_log_tail(self.gateway.log)}"
            )

    async def stop(self, grace: float) -> None:
        """SIGTERM every process, wait up to ``grace`` + slack for them, then SIGKILL."""
        children = self.children
        for c in children:
            if c.alive():
                with contextlib.suppress(ProcessLookupError):
                    c.proc.send_signal(signal.SIGTERM)
        await _wait_exited(children, grace + _STOP_SLACK)
        for c in children:
            if c.alive():
                c.proc.kill()
        await _wait_exited(children, _KILL_WAIT)
        for c in children:
            if c in self.cleanup.workers and not c.alive():
                self.cleanup.workers.remove(c)


async def _wait_exited(workers: list[Child], timeout: float) -> None:
    """Wait (in a thread: ``Popen.wait`` blocks) until each worker exits, ``timeout`` in all."""
    deadline = time.monotonic() + timeout
    for w in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(w.proc.wait, max(0.0, deadline - time.monotonic()))
