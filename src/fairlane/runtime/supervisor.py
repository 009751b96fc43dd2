"""Worker process supervision: what ``fairlane worker --processes N`` runs.

This module owns the *child processes* of one supervisor and nothing inside them: it
starts N copies of one command, restarts a copy that dies unexpectedly (killed by a signal,
or a non-zero exit) after a bounded backoff, and on SIGTERM/SIGINT forwards SIGTERM to
every copy and waits for them, within the worker grace period plus some slack, before
SIGKILL. It knows nothing of apps, lanes or servers: the command line builds the child
command (:mod:`fairlane.cli.worker`), and each child is an ordinary worker process.

It is synchronous on purpose: a supervisor has no I/O to overlap, and a plain polling
loop has no background tasks to lose track of. Every wait in it is bounded.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from types import FrameType

__all__ = ["Supervisor", "describe_exit"]

log = logging.getLogger("fairlane.supervisor")

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_KILL_WAIT = 5.0  # s: a SIGKILLed process is gone at once unless stuck in the kernel


def describe_exit(returncode: int) -> str:
    """``returncode`` of a child as people say it: ``exit code 1``, ``killed by SIGKILL``."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


@dataclass
class _Slot:
    """One of the N places a child runs in; it outlives the children that fill it."""

    number: int
    delay: float  # the backoff before this slot's next restart
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    start_at: float | None = 0.0  # None: nothing more to start here (a child exited cleanly)
    starts: int = 0


class Supervisor:
    """Keep ``processes`` copies of the command ``argv`` running until SIGTERM/SIGINT.

    A child that exits 0 has finished (``--burst`` ran out of work, or someone stopped it
    on purpose) and is not replaced; :meth:`run` returns 0 once every child has. A child
    that exits with a code in ``fatal_exit_codes`` (a usage error, which no restart fixes)
    stops everything and :meth:`run` returns that code. Any other death is restarted after
    the slot's backoff: ``backoff_initial`` doubling up to ``backoff_cap``, back to
    ``backoff_initial`` once a child has lived ``stable_after`` seconds.
    """

    def __init__(
        self,
        argv: list[str],
        processes: int,
        *,
        grace_period: float = 30.0,
        stop_slack: float = 5.0,
        backoff_initial: float = 0.5,
        backoff_cap: float = 10.0,
        stable_after: float = 30.0,
        poll_interval: float = 0.1,
        fatal_exit_codes: Iterable[int] = (),
    ) -> None:
        if not argv:
            raise ValueError("argv must name a command")
        if processes < 1:
            raise ValueError(f"processes must be at least 1, not {processes}")
        if not 0 < backoff_initial <= backoff_cap:
            raise ValueError("backoff_initial must be positive and at most backoff_cap")
        self.argv = list(argv)
        self.processes = processes
        self.grace_period = grace_period
        self.stop_slack = stop_slack
        self.backoff_initial = backoff_initial
        self.backoff_cap = backoff_cap
        self.stable_after = stable_after
        self.poll_interval = poll_interval
        self.fatal_exit_codes = frozenset(fatal_exit_codes)
        self._slots = [_Slot(number, backoff_initial) for number in range(1, processes + 1)]
        self._restarts = 0
        self._signal: int | None = None

    @property
    def restarts(self) -> int:
        """How many children have been started in place of one that died."""
        return self._restarts

    @property
    def pids(self) -> list[int]:
        """Process ids of the children started and not yet seen to exit."""
        return [slot.proc.pid for slot in self._slots if slot.proc is not None]

    def run(self) -> int:
        """Supervise until a stop signal or until every child is done; the exit code.

        Call it from the main thread: it installs SIGTERM and SIGINT handlers (and puts
        the previous ones back before returning).
        """
        previous = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
        for sig in _STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        # not the command: it may hold a server URL with a password
        log.info("supervising %d worker processes", self.processes)
        try:
            return self._supervise()
        finally:
            # also on an unexpected error here, so that no child is left running unsupervised
            self._stop_all()
            for sig, handler in previous.items():
                if handler is not None:  # None: not installed from Python; nothing to restore
                    signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # only a flag: logging or waiting inside a signal handler can deadlock on locks
        # the interrupted main thread holds
        if self._signal is None:
            self._signal = signum

    def _supervise(self) -> int:
        while self._signal is None:
            now = time.monotonic()
            for slot in self._slots:
                if slot.proc is not None:
                    returncode = slot.proc.poll()
                    if returncode is not None:
                        fatal = self._reaped(slot, returncode, now)
                        if fatal is not None:
                            return fatal
                if slot.proc is None and slot.start_at is not None and now >= slot.start_at:
                    self._start(slot, now)
            if all(slot.proc is None and slot.start_at is None for slot in self._slots):
                log.info("every worker process exited cleanly; the supervisor exits")
                return 0
            # time.sleep resumes after a signal handler runs, so a stop waits at most this
            time.sleep(self.poll_interval)
        log.info("received %s: stopping the worker processes", signal.Signals(self._signal).name)
        return 0

    def _start(self, slot: _Slot, now: float) -> None:
        try:
            proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL)
        except OSError as exc:
            log.error(
                "cannot start worker process %d: %s; retrying in %.1fs",
                slot.number,
                exc,
                slot.delay,
            )
            self._back_off(slot, now)
            return
        slot.proc, slot.started = proc, now
        if slot.starts:
            self._restarts += 1
            log.info(
                "worker process %d restarted as pid %d (restart %d)",
                slot.number,
                proc.pid,
                self._restarts,
            )
        else:
            log.info("worker process %d started as pid %d", slot.number, proc.pid)
        slot.starts += 1

    def _reaped(self, slot: _Slot, returncode: int, now: float) -> int | None:
        """Deal with the exit of ``slot``'s child; a fatal exit code to stop with, or None."""
        assert slot.proc is not None
        pid, lived = slot.proc.pid, now - slot.started
        slot.proc = None
        status = describe_exit(returncode)
        if returncode == 0:
            slot.start_at = None
            log.info(
                "worker process %d (pid %d) exited cleanly after %.1fs; not restarting it",
                slot.number,
                pid,
                lived,
            )
            return None
        if returncode in self.fatal_exit_codes:
            log.error(
                "worker process %d (pid %d) failed with %s, which a restart cannot fix; "
                "stopping the others",
                slot.number,
                pid,
                status,
            )
            return returncode
        if lived >= self.stable_after:
            slot.delay = self.backoff_initial  # a crash after a long run is not a crash loop
        log.warning(
            "worker process %d (pid %d) died after %.1fs: %s; restarting it in %.1fs",
            slot.number,
            pid,
            lived,
            status,
            slot.delay,
        )
        self._back_off(slot, now)
        return None

    def _back_off(self, slot: _Slot, now: float) -> None:
        slot.start_at = now + slot.delay
        slot.delay = min(self.backoff_cap, slot.delay * 2)

    def _stop_all(self) -> None:
        """SIGTERM every child, wait out the grace period (plus slack), then SIGKILL."""
        running = [slot for slot in self._slots if slot.proc is not None]
        if not running:
            return
        for slot in running:
            self._send(slot, signal.SIGTERM)
        # the slack covers a worker's own shutdown after its grace period: the final
        # settle, handing back unstarted jobs, leaving
        deadline = time.monotonic() + self.grace_period + self.stop_slack
        for slot in running:
            self._wait(slot, max(0.0, deadline - time.monotonic()))
        stuck = [slot for slot in running if slot.proc is not None]
        if stuck:
            log.warning(
                "%d worker process(es) still running %.1fs after SIGTERM: sending SIGKILL",
                len(stuck),
                self.grace_period + self.stop_slack,
            )
            for slot in stuck:
                self._send(slot, signal.SIGKILL)
            for slot in stuck:
                self._wait(slot, _KILL_WAIT)
        for slot in running:
            if slot.proc is not None:
                log.error(
                    "worker process %d (pid %d) did not exit even after SIGKILL",
                    slot.number,
                    slot.proc.pid,
                )

    @staticmethod
    def _send(slot: _Slot, sig: signal.Signals) -> None:
        assert slot.proc is not None
        # it may have exited since the last poll, and been reaped by another wait
        with contextlib.suppress(ProcessLookupError):
            slot.proc.send_signal(sig)

    @staticmethod
    def _wait(slot: _Slot, timeout: float) -> None:
        """Wait up to ``timeout`` s for ``slot``'s child; clears ``slot.proc`` if it exited."""
        assert slot.proc is not None
        try:
            returncode = slot.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return
        log.info(
            "worker process %d (pid %d) stopped: %s",
            slot.number,
            slot.proc.pid,
            describe_exit(returncode),
        )
        slot.proc = None
