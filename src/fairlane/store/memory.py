"""The server's memory as admission reads it, and the server's own word that it is full.

``MemoryGauge`` holds one process's reading of one server's memory (``INFO memory``:
``used_memory`` less ``mem_not_counted_for_evict``, which is what the server holds
against ``maxmemory``, and ``maxmemory``) and the bytes its submissions were reckoned
to add since; ``admit`` refuses a submission with ``StoreFull`` while those are above
the app's mark, before anything is sent or offloaded
(``fairlane.policy.admission.memory`` states the rule and when to read again). The
reading is made by the submitting call that finds it due, one at a time: the calls
behind it wait for it rather than pass on an old one. Between readings a submission
costs no server call. The stores of one server share a gauge; on a cluster each
shard's store reads the node that holds its slot.

``out_of_memory`` tells the server's refusal of a write past ``maxmemory`` (the
``OOM`` error of a command, of a function call, of a script's write, of a command in
a pipeline); ``server_full`` makes one the ``StoreFull`` callers see.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from redis.exceptions import OutOfMemoryError, ResponseError

from fairlane.errors import StoreFull
from fairlane.policy.admission.memory import (
    DEFAULT_MEMORY_MARK,
    JOB_OVERHEAD_BYTES,
    MemoryReading,
    check_mark,
    depth,
    reading_due,
    store_full,
    store_full_retry_after,
)
from fairlane.policy.admission.rejections import RetryAfterPolicy
from fairlane.store.wire import NewJob

__all__ = ["MemoryGauge", "out_of_memory", "server_full"]

log = logging.getLogger("fairlane.store")

#: what the server says when it refuses a write past maxmemory, whatever wraps it
_OOM_TEXT: Final = "used memory > 'maxmemory'"
#: the Retry-After of a write the server refused: the depth of a server at its limit
_RETRY: Final = RetryAfterPolicy()

ReadInfo = Callable[[], Awaitable[Mapping[str, Any]]]


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is the server refusing a write because it is at ``maxmemory``."""
    if isinstance(exc, OutOfMemoryError):
        return True
    return isinstance(exc, ResponseError) and (str(exc).startswith("OOM") or _OOM_TEXT in str(exc))


def server_full(exc: BaseException) -> StoreFull:
    """The server's refusal of a write past ``maxmemory`` as ``StoreFull``."""
    wait = store_full_retry_after(1.0, random.random(), _RETRY)
    return StoreFull(
        "the store is full: the Redis server is at its memory limit (maxmemory) and "
        f"refused the write, so nothing was written ({exc})",
        wait,
    )


class MemoryGauge:
    """One process's reading of one server's memory, and the mark it is held to."""

    def __init__(self, mark: float | None = DEFAULT_MEMORY_MARK) -> None:
        #: the share of maxmemory above which new jobs are refused; None: off
        self.mark = check_mark(mark)
        self.reading: MemoryReading | None = None
        self._read_at = 0.0
        self._sent = 0  # bytes reckoned for the calls answered since the reading
        self._under_way = 0  # and for those not answered yet
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def due(self) -> bool:
        elapsed = time.monotonic() - self._read_at
        return reading_due(self.reading, self.mark, elapsed, self._sent)

    def take(self, info: Mapping[str, Any]) -> None:
        """Keep what ``INFO memory`` answered."""
        used = int(info.get("used_memory", 0)) - int(info.get("mem_not_counted_for_evict", 0))
        self.reading = MemoryReading(max(0, used), max(0, int(info.get("maxmemory", 0))))
        self._read_at = time.monotonic()
        self._sent = 0

    async def refresh(self, read: ReadInfo) -> None:
        """Read the server's memory with ``read`` if a reading is due; a call that finds
        one under way waits for it."""
        if not self.due():
            return
        async with self._guard():
            if not self.due():
                return  # read while this call waited
            try:
                info = await read()
            except ResponseError as exc:
                # INFO renamed or denied to this user: the mark cannot be kept
                log.warning("the server's memory cannot be read (%s): the memory mark is off", exc)
                self.mark = None
                return
            self.take(info)

    async def admit(self, read: ReadInfo, jobs: Sequence[NewJob]) -> int:
        """What a submission passes before anything is offloaded or sent: ``StoreFull``
        if the server is above the mark (read first when a reading is due), else the
        bytes its jobs are reckoned at, under way until ``settled`` is given them."""
        if self.mark is None:
            return 0
        if self.due():
            await self.refresh(read)
        reading, mark = self.reading, self.mark
        if reading is None or mark is None or reading.maxmemory <= 0:
            return 0  # nothing to hold it to: nothing to reckon
        if store_full(reading, mark, self._sent + self._under_way):
            raise self.refusal(reading, mark)
        size = sum(len(job.args) for job in jobs) + JOB_OVERHEAD_BYTES * len(jobs)
        self._under_way += size
        return size

    def settled(self, size: int) -> None:
        """A submission ``admit`` reckoned at ``size`` bytes was answered (or failed)."""
        if size:
            self._under_way -= size
            self._sent += size

    @staticmethod
    def refusal(reading: MemoryReading, mark: float) -> StoreFull:
        deep = depth(reading, mark)
        return StoreFull(
            f"the store is full: the Redis server uses {reading.used} of its "
            f"{reading.maxmemory} bytes (maxmemory), at or above the memory mark ({mark:g}) "
            "with what is under way; new jobs are refused until workers drain it, and "
            "nothing was written",
            store_full_retry_after(deep, random.random(), _RETRY),
            deep,
        )

    def _guard(self) -> asyncio.Lock:
        # one lock per event loop: an app may be driven by one loop after another
        loop = asyncio.get_running_loop()
        if self._lock is None or self._loop is not loop:
            self._lock, self._loop = asyncio.Lock(), loop
        return self._lock
