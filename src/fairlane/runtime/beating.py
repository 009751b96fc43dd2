"""The worker's beat, sent from a thread of its own: liveness a slow event loop cannot
fake or lose.

A worker that beat and then stays silent for ``lease.worker_timeout`` is dead: the next
beat of another worker takes its jobs back at once (``workers.beat`` in the Lua library).
So the beat says only that the *process* lives, and it is sent from where a blocked
event loop does not stop it: a thread, on a blocking connection of its own
(``store/beats.py``), as ``/health`` is served from its own thread. A task that blocks
the loop (a sync SDK call, ``time.sleep``) stops neither; a process killed or frozen
(``kill -9``, SIGSTOP, a host gone) stops both, and loses its jobs within
``worker_timeout`` and one beat of another worker. The loop proves its own progress as
before, by renewing its leases.

The rule, per shard: the thread beats every ``heartbeat_interval`` while the worker's
leases there can still be live, that is until ``lease.duration`` after the last
renewal (or fetch) of the loop that got through (``Settler.leases_end``). Past that the
loop has made no progress for a whole lease, or has not reached the server: every lease
the worker held there has run out and the sweep takes those jobs back whatever the
beats say, so beating on would protect nothing, and would keep the worker's slots in
its lanes' capacity while it leases nothing (until it goes stale, three lease lengths
later). The thread falls silent instead: ``worker_timeout`` later the worker is dead,
its jobs come back at another worker's next beat and its slots leave the capacity. It
beats again once a renewal gets through. As ``heartbeat_interval < worker_timeout``,
that silence is noticed only after the leases have run out: a live worker whose loop
stalls keeps its jobs until their leases end, never less.

The GIL: the thread runs while the loop's thread sleeps, waits for I/O or runs Python
code (the interpreter hands the GIL over every few milliseconds), but not while one C
call holds it (a large ``json.loads``, a long regular-expression match, an extension
that keeps it): a call holding it longer than ``worker_timeout`` silences the thread
too, and the worker looks dead. Such code belongs in a process task.

Stopping: ``stop`` ends the thread and waits for it (off the loop) up to ``stop_bound``,
the bound of the one call that may be in flight. The worker stops it before it says
goodbye (``leave``), so no beat follows the goodbye and brings back a worker that left.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Final

import msgspec

from fairlane.config.settings import LeaseSettings
from fairlane.runtime.outage import Outage
from fairlane.store.beats import BeatLine
from fairlane.store.wire import StoreError

__all__ = ["BeatShard", "BeatThread"]

log = logging.getLogger("fairlane.worker")
_MAX_PASSES: Final = 20
#: what a join waits beyond the bound of the call in flight: the thread's own steps
_JOIN_SLACK: Final = 1.0


class BeatShard(msgspec.Struct, frozen=True):
    """A shard the worker serves, and until when (monotonic) its leases there can be live."""

    shard: int
    live_until: Callable[[], float]


class BeatThread:
    """Beats every shard a worker serves, from a thread, until stopped."""

    def __init__(
        self, line: BeatLine, worker_id: str, lease: LeaseSettings, shards: Sequence[BeatShard]
    ) -> None:
        self.line = line
        self.worker_id = worker_id
        self.lease = lease
        self.shards = list(shards)
        self._dead_ms = round(lease.worker_timeout * 1000)
        many = line.shards > 1
        self._outages = {
            s.shard: Outage(
                f"worker {worker_id}{f', shard {s.shard}' if many else ''}: beating", log
            )
            for s in self.shards
        }
        self._silent: set[int] = set()  # shards whose leases have run out
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"fairlane-beat {worker_id}", daemon=True
        )

    @property
    def stop_bound(self) -> float:
        """The longest ``stop`` waits for the thread: a call in flight, and a little more."""
        return self.line.bound + _JOIN_SLACK

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    async def stop(self) -> None:
        """Beat no more; returns once the thread has ended, or after ``stop_bound``."""
        self._stop.set()
        if not self._thread.is_alive():
            return
        # joined off the loop: the loop may have its own goodbyes to send meanwhile
        await asyncio.to_thread(self._thread.join, self.stop_bound)
        if self._thread.is_alive():
            log.warning(
                "worker %s: a beat still unanswered after %.1fs; going on without it",
                self.worker_id,
                self.stop_bound,
            )

    def _run(self) -> None:
        interval = self.lease.heartbeat_interval
        try:
            while not self._stop.is_set():
                began = time.monotonic()
                for shard in self.shards:
                    if self._stop.is_set():
                        return
                    self._beat(shard)
                # a steady pace, so another worker hears us at least once per interval
                self._stop.wait(max(0.0, began + interval - time.monotonic()))
        finally:
            self.line.close()

    def _beat(self, shard: BeatShard) -> None:
        if not self._live(shard):
            return
        outage = self._outages[shard.shard]
        batch = self.lease.sweep_batch
        try:
            for _ in range(_MAX_PASSES):
                retried, dead, gone = self.line.beat(
                    shard.shard, self.worker_id, self._dead_ms, batch, random.getrandbits(31)
                )
                if retried or dead:
                    log.warning(
                        "worker(s) %s stopped beating: took back %d jobs (%d dead-lettered)",
                        ", ".join(gone),
                        len(retried) + len(dead),
                        len(dead),
                    )
                if len(retried) + len(dead) < batch or self._stop.is_set():
                    break
        except StoreError as exc:
            outage.failed(exc)
        except Exception:
            # not the server gone (a script error, say): the thread goes on, since a
            # thread that ended would make this live worker look dead
            log.exception("worker %s: a beat failed", self.worker_id)
        else:
            outage.recovered()

    def _live(self, shard: BeatShard) -> bool:
        """Whether the worker's leases in ``shard`` can still be live; says when that changes."""
        live = time.monotonic() < shard.live_until()
        if not live and shard.shard not in self._silent:
            self._silent.add(shard.shard)
            log.warning(
                "worker %s: no lease renewal got through for a whole lease (%.0fs: the event "
                "loop is blocked, or the server unreachable); its leases have run out, so it "
                "stops beating%s and will be taken for dead",
                self.worker_id,
                self.lease.duration,
                f" in shard {shard.shard}" if self.line.shards > 1 else "",
            )
        elif live and shard.shard in self._silent:
            self._silent.discard(shard.shard)
            log.warning("worker %s: its leases are renewed again; beating again", self.worker_id)
        return live
