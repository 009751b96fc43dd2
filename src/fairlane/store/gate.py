"""How many of an app's calls use the server at once, and what the others do meanwhile.

An app process shares one pool of connections between all its callers. redis-py's
pools refuse a caller when every connection is taken (``MaxConnectionsError``, which is
a ``ConnectionError``), so ``asyncio.gather`` over a few hundred enqueues failed most of
them as if the server were down. A ``CallGate`` in front of the pool admits at most
``limit`` calls at once; the rest wait their turn, first come first served, each for at
most ``wait`` seconds (the bound of any call's reply), and only a wait that long fails,
as ``StoreBusy``: the server answers, but the app's callers have outnumbered its
connections for longer than one call may take.

The gate, not the pool, is the bound: the pool is made ``headroom`` connections larger,
for the few uses that hold a connection outside a call (a result subscription, a watched
transaction, a pipeline some read models run), so a gated call always finds one free.
One gate serves every node of a cluster (each node's pool has the same size), so no node
sees more than ``limit`` of the app's calls either.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

from fairlane.store.wire import StoreError

__all__ = ["POOL_HEADROOM", "CallGate", "StoreBusy"]

#: connections beyond the gate's limit, for uses that hold one outside a gated call
POOL_HEADROOM: Final = 16


class StoreBusy(StoreError):
    """Every connection of the app was in use for as long as a call may wait.

    The server answers; the process has more calls in flight than connections
    (``connection.max_connections``), for longer than ``connection.timeout``. Nothing
    was done. Retry later, or raise ``connection.max_connections``.
    """


def raise_if_cancelling() -> None:
    """Raise ``CancelledError`` when the current task is being cancelled. A timeout or a
    client error that comes with a cancellation (a deadline that fell in the same turn
    of the loop as the cancel, a client that converts what interrupted its read) must
    not turn it into an error the caller would catch and go on from: the task would
    then outlive its cancellation, and whoever awaits it wait for ever."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # a thread of its own (the worker's beat): no task to cancel
        return
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class CallGate:
    """Admits at most ``limit`` calls at once; others wait up to ``wait`` seconds."""

    def __init__(self, limit: int, wait: float | None) -> None:
        if limit < 1:
            raise ValueError(f"a call gate needs at least one connection, got {limit}")
        self.limit = limit
        self.wait = wait
        self._free = asyncio.Semaphore(limit)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the gate's places for the block's duration."""
        if self._free.locked():  # the common case, a free place, skips the timer
            try:
                async with asyncio.timeout(self.wait):
                    await self._free.acquire()
            except TimeoutError:
                raise_if_cancelling()
                raise StoreBusy(
                    f"all {self.limit} of the app's connections stayed in use for "
                    f"{self.wait}s (connection.max_connections); nothing was done"
                ) from None
        else:
            await self._free.acquire()
        try:
            yield
        finally:
            self._free.release()
