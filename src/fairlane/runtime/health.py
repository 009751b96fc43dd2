"""Worker health: an event-loop lag monitor, which the ``/health`` endpoint
(``runtime/healthserver.py``) reports.

The endpoint runs in its own thread, so it still answers -- with 503 -- while the
event loop is blocked; an endpoint on the loop itself would simply hang.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["LoopMonitor"]

_TICK = 0.1


class LoopMonitor:
    """Records when the event loop last ran, to tell how long it has been blocked."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.last_beat = time.monotonic()
        self.worst_lag = 0.0

    async def run(self, closed: asyncio.Event) -> None:
        while not closed.is_set():
            before = time.monotonic()
            try:
                async with asyncio.timeout(_TICK):
                    await closed.wait()
            except TimeoutError:
                pass
            now = time.monotonic()
            self.worst_lag = max(self.worst_lag, now - before - _TICK)
            self.last_beat = now

    def lag(self) -> float:
        return max(0.0, time.monotonic() - self.last_beat - _TICK)

    def healthy(self) -> bool:
        return self.lag() <= self.threshold
