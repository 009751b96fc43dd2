"""The demo's processes: a private server, one worker process per lane, and their cleanup.

This module owns every process the demo starts and every key it leaves, and makes sure
none outlives it:

* :class:`PrivateServer` starts a server of the demo's own (the dev-server helper of
  :mod:`fairlane.store.server`, in a private state directory: it runs in its own session,
  so a Ctrl-C in the terminal reaches the demo, which stops it last) and stops it;
* :class:`Fleet` runs ``fairlane worker fairlane.demo.app:app --lanes <lane>`` for the
  lanes ``light`` and ``heavy`` as real subprocesses, in their own process group (the
  demo, not the terminal, decides when they stop), each logging to a file; it stops
  them with SIGTERM (a graceful drain), waits a bounded time, then SIGKILLs;
* :class:`Cleanup` is the synchronous last line of defence, run whatever happened (an
  error, a second Ctrl-C): it kills any worker still alive, deletes the keys of every
  app the demo used, and stops the private server.

Every wait here is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import redis

from fairlane.demo.app import APP_ENV, HEAVY_SLOTS, LIGHT_SLOTS, MODE_ENV, PARENT_ENV, Mode
from fairlane.store.keys import AppKeys
from fairlane.store.server import ensure_dev_server, stop_dev_server

__all__ = ["LANES", "Cleanup", "DemoError", "Fleet", "PrivateServer", "WorkerProcess"]

#: the lanes the demo serves, with each one's worker slots
LANES: dict[str, int] = {"light": LIGHT_SLOTS, "heavy": HEAVY_SLOTS}
WORKER_APP = "fairlane.demo.app:app"
_STOP_SLACK = 5.0  # s beyond the workers' grace period before SIGKILL
_KILL_WAIT = 5.0


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
class WorkerProcess:
    """One ``fairlane worker`` subprocess serving one lane."""

    lane: str
    slots: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Cleanup:
    """What must not outlive the demo: worker processes, app keys, the private server."""

    url: str | None = None
    server: PrivateServer | None = None
    workers: list[WorkerProcess] = field(default_factory=list)
    apps: list[str] = field(default_factory=list)
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fairlane-demo-")))

    def __enter__(self) -> Cleanup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Kill live workers, delete every app's keys, stop the server; never raises."""
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


def kill_workers(workers: list[WorkerProcess]) -> None:
    """SIGTERM, a short bounded wait, then SIGKILL, for every worker still alive."""
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


def delete_keys_sync(url: str, apps: list[str]) -> int:
    """Delete every key of the named apps (SCAN, then UNLINK in batches)."""
    client = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
    removed = 0
    try:
        for name in apps:
            batch: list[bytes] = []
            for key in client.scan_iter(match=AppKeys.for_app(name).match_all(), count=1000):
                batch.append(key)
                if len(batch) >= 500:
                    removed += int(client.unlink(*batch))
                    batch.clear()
            if batch:
                removed += int(client.unlink(*batch))
    finally:
        client.close()
    return removed


class Fleet:
    """The worker processes of one run: one per lane, for app ``name`` in ``mode``."""

    def __init__(self, name: str, mode: Mode, url: str, cleanup: Cleanup) -> None:
        self.name = name
        self.mode = mode
        self.url = url
        self.cleanup = cleanup
        self.workers: list[WorkerProcess] = []

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRLANE_")}
        env.update(
            {
                APP_ENV: self.name,
                MODE_ENV: self.mode,
                PARENT_ENV: str(os.getpid()),
                "PYTHONUNBUFFERED": "1",
            }
        )
        for lane, slots in LANES.items():
            log = self.cleanup.log_dir / f"{self.name}-{lane}.log"
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
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    argv,
                    cwd=self.cleanup.log_dir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    # not the terminal's process group: a Ctrl-C reaches the demo alone,
                    # which then stops the workers in order
                    process_group=0,
                )
            worker = WorkerProcess(lane, slots, proc, log)
            self.workers.append(worker)
            self.cleanup.workers.append(worker)

    def check(self) -> None:
        """Raise ``DemoError`` (with the log's tail) if a worker has exited."""
        for w in self.workers:
            code = w.proc.poll()
            if code is not None:
                raise DemoError(
                    f"the {w.lane} worker (pid {w.pid}) exited with code {code}; its log:\n"
                    f"{_log_tail(w.log)}"
                )

    async def stop(self, grace: float) -> None:
        """SIGTERM every worker, wait up to ``grace`` + slack for them, then SIGKILL."""
        for w in self.workers:
            if w.alive():
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(signal.SIGTERM)
        await _wait_exited(self.workers, grace + _STOP_SLACK)
        for w in self.workers:
            if w.alive():
                w.proc.kill()
        await _wait_exited(self.workers, _KILL_WAIT)
        for w in self.workers:
            if w in self.cleanup.workers and not w.alive():
                self.cleanup.workers.remove(w)


async def _wait_exited(workers: list[WorkerProcess], timeout: float) -> None:
    """Wait (in a thread: ``Popen.wait`` blocks) until each worker exits, ``timeout`` in all."""
    deadline = time.monotonic() + timeout
    for w in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(w.proc.wait, max(0.0, deadline - time.monotonic()))
