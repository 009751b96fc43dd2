"""Attempt timeouts and job deadlines: one loop timer for all the timed attempts
running on a worker.

An async attempt with a timeout is stopped by the worker when it runs past it, and an
attempt of any executor when it runs past its job's deadline (``runtime/attempts.py``).
A loop timer per attempt, made when it starts and cancelled when it ends, costs about
as much as the rest of a no-op job's start. Here attempts due in the same millisecond
share a bucket, the buckets' due times are kept in a heap, and one timer is armed, for
the earliest. An attempt that ends leaves its bucket at once, so nothing of it is kept
for the length of a long timeout; a bucket emptied before it falls due leaves a stale
entry in the heap, dropped when it comes up or when stale entries outnumber the live
ones (the heap is then rebuilt).

A bucket falls due at its millisecond (the attempt's start plus its timeout, rounded
up), so an attempt is stopped no earlier than its timeout and, loop lag aside, less
than a millisecond after it -- the precision of the loop's own timers.

A deadline is a time on the server's clock (ms), which the worker's host clock may be
far from (time is the server's: a host an hour off still keeps it). ``ServerClock``
reads a server's clock (``TIME``) and keeps its offset from the loop's clock, which is
monotonic: a deadline becomes a due millisecond of the loop like a timeout's. The
reading is placed at the reply's arrival, when the server's clock is at least what it
read (and the reading is truncated to the millisecond), so that an attempt is stopped
no earlier than its deadline, and later by at most the reading's round trip. The clock
is read again every ``RESYNC_S``, as a server's clock may be stepped; until a first
reading succeeds no deadline is timed (the store still expires a job whose retry would
come after its deadline).
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Awaitable, Callable

from fairlane.runtime.lease import wait_or_stop
from fairlane.store.wire import StoreError

__all__ = ["RESYNC_S", "Deadlines", "ServerClock"]

#: how early a bucket may be taken as due: the loop's timers fire up to half a
#: millisecond early (they are kept in whole milliseconds)
_EARLY_MS = 0.5
#: stale heap entries tolerated beyond the live ones before the heap is rebuilt
_SLACK = 1024
#: how often a server's clock is read again (s): a clock slewed by NTP drifts from the
#: loop's by at most 0.5 ms a second, 30 ms a minute
RESYNC_S = 60.0
#: how soon a reading is tried again while none has succeeded (s)
_RETRY_S = 1.0


class Deadlines:
    """The timed attempts of one worker, by due millisecond; ``on_due`` is given the
    attempts (task, job id) whose time is up."""

    def __init__(self, on_due: Callable[[list[tuple[asyncio.Task[None], str]]], None]) -> None:
        self._on_due = on_due
        # due ms -> {attempt key: (its task, its job id)}
        self._buckets: dict[int, dict[int, tuple[asyncio.Task[None], str]]] = {}
        self._heap: list[int] = []
        self._armed: asyncio.TimerHandle | None = None
        self._armed_ms = math.inf

    def __len__(self) -> int:
        """Attempts timed now."""
        return sum(len(b) for b in self._buckets.values())

    @property
    def entries(self) -> int:
        """Due times in the heap, stale ones included."""
        return len(self._heap)

    def due(self, seconds: float) -> int:
        """The due millisecond of an attempt timed out ``seconds`` from now (for ``put``)."""
        return math.ceil((asyncio.get_running_loop().time() + seconds) * 1000)

    def put(self, due: int, key: int, task: asyncio.Task[None], job_id: str) -> None:
        """Time ``task`` (running job ``job_id``) out at ``due``, under ``key`` (unique
        among the attempts timed); ``discard`` ends it."""
        bucket = self._buckets.get(due)
        if bucket is None:
            buckets = self._buckets
            bucket = buckets[due] = {}
            if len(self._heap) > 2 * len(buckets) + _SLACK:
                self._heap = sorted(buckets)  # a sorted list is a heap
            else:
                heapq.heappush(self._heap, due)
            if due < self._armed_ms:
                self._arm(asyncio.get_running_loop(), due)
        bucket[key] = (task, job_id)

    def add(self, key: int, task: asyncio.Task[None], job_id: str, seconds: float) -> int:
        """``put`` ``seconds`` from now; returns the due millisecond."""
        due = self.due(seconds)
        self.put(due, key, task, job_id)
        return due

    def discard(self, key: int, due: int) -> None:
        """The attempt timed under ``key`` has ended (before its due time, or after)."""
        bucket = self._buckets.get(due)
        if bucket is not None:
            bucket.pop(key, None)
            if not bucket:
                del self._buckets[due]

    def _arm(self, loop: asyncio.AbstractEventLoop, due: int) -> None:
        if self._armed is not None:
            self._armed.cancel()
        self._armed_ms = due
        self._armed = loop.call_at(due / 1000, self._fire)

    def _fire(self) -> None:
        loop = asyncio.get_running_loop()
        self._armed, self._armed_ms = None, math.inf
        now_ms = loop.time() * 1000 + _EARLY_MS
        heap, buckets = self._heap, self._buckets
        due: list[tuple[asyncio.Task[None], str]] = []
        while heap and heap[0] <= now_ms:
            bucket = buckets.pop(heapq.heappop(heap), None)
            if bucket:
                due.extend(bucket.values())
        while heap and heap[0] not in buckets:  # stale: emptied before it fell due
            heapq.heappop(heap)
        if heap:
            self._arm(loop, heap[0])
        if due:
            self._on_due(due)


class ServerClock:
    """A server's clock as the worker's loop sees it (see the module docstring)."""

    def __init__(self) -> None:
        #: the server's ms minus the loop's; None until a reading succeeds
        self.offset_ms: float | None = None

    async def sync(self, server_ms: Callable[[], Awaitable[int]]) -> bool:
        """Read the server's clock (``server_ms``); False if it could not be read (the
        offset stays as it was)."""
        try:
            reading = await server_ms()
        except StoreError:
            return False
        # the least the offset can be: a deadline timed from it is never early
        self.offset_ms = reading - asyncio.get_running_loop().time() * 1000
        return True

    def due(self, server_ms: int) -> int | None:
        """The loop's due millisecond (for ``Deadlines.put``) of ``server_ms`` on the
        server's clock; None while the clock has not been read."""
        offset = self.offset_ms
        if offset is None:
            return None
        # later by what a bucket may be taken early, so that it is never early; 0 would
        # mean "not timed" to the caller
        return max(1, math.ceil(server_ms - offset + _EARLY_MS))

    async def keep(self, server_ms: Callable[[], Awaitable[int]], stop: asyncio.Event) -> None:
        """Read the clock again every ``RESYNC_S`` (every ``_RETRY_S`` until a reading
        succeeds) until ``stop`` is set."""
        while not await wait_or_stop(stop, _RETRY_S if self.offset_ms is None else RESYNC_S):
            await self.sync(server_ms)
