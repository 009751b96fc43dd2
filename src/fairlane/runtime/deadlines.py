"""Attempt timeouts: one loop timer for all the timed attempts running on a worker.

An async attempt with a timeout is stopped by the worker when it runs past it
(``runtime/attempts.py``). A loop timer per attempt, made when it starts and cancelled
when it ends, costs about as much as the rest of a no-op job's start. Here attempts
due in the same millisecond share a bucket, the buckets' due times are kept in a heap,
and one timer is armed, for the earliest. An attempt that ends leaves its bucket at
once, so nothing of it is kept for the length of a long timeout; a bucket emptied
before it falls due leaves a stale entry in the heap, dropped when it comes up or
when stale entries outnumber the live ones (the heap is then rebuilt).

A bucket falls due at its millisecond (the attempt's start plus its timeout, rounded
up), so an attempt is stopped no earlier than its timeout and, loop lag aside, less
than a millisecond after it -- the precision of the loop's own timers.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable

__all__ = ["Deadlines"]

#: how early a bucket may be taken as due: the loop's timers fire up to half a
#: millisecond early (they are kept in whole milliseconds)
_EARLY_MS = 0.5
#: stale heap entries tolerated beyond the live ones before the heap is rebuilt
_SLACK = 1024


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
