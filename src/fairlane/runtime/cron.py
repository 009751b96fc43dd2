"""Cron: each worker computes the next tick and enqueues it with an idempotency key.

Every worker of the app runs this loop; the key ``cron:<task>:<tick>`` makes the
enqueue of one tick happen once however many workers race for it, and without any
lock or leader election.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Protocol

from cronsim import CronSim

from fairlane.errors import FairlaneError
from fairlane.registry import CronEntry
from fairlane.runtime.lease import wait_or_stop
from fairlane.store.wire import StoreError

__all__ = ["CRON_TENANT", "Enqueue", "cron_loop", "tick_key"]

log = logging.getLogger("fairlane.cron")
_RECHECK_SECONDS = 30.0
CRON_TENANT = "cron"


class Enqueue(Protocol):
    """Enqueues a task by name, as the app's producers do (``App.enqueue``): through
    admission, with the app's durability and a ``send`` span."""

    def __call__(self, task: str, /, *, tenant: str, idempotency_key: str) -> Awaitable[object]: ...


def tick_key(task_name: str, tick: datetime) -> str:
    return f"cron:{task_name}:{int(tick.timestamp())}"


async def cron_loop(
    crons: Mapping[str, CronEntry],
    stop: asyncio.Event,
    server_ms: Callable[[], Awaitable[int]],
    enqueue: Enqueue,
) -> None:
    """Enqueue each cron task's ticks with ``enqueue`` until ``stop``; ``server_ms``
    reads the server's clock.

    Ticks are placed on the server's clock, not the host's: a worker whose clock is off
    by an hour still enqueues each tick on time, and workers on hosts whose clocks
    disagree race for the same tick (and key) rather than for different ones.
    """
    if not crons:
        return
    now = await _server_now(server_ms, stop)
    if now is None:
        return
    upcoming = {name: next(CronSim(entry.schedule, now)) for name, entry in crons.items()}
    while True:
        name = min(upcoming, key=upcoming.__getitem__)
        tick = upcoming[name]
        now = await _server_now(server_ms, stop)
        if now is None:
            return
        delay = (tick - now).total_seconds()
        if delay > 0:
            # a long wait is cut into pieces, so each piece starts from a fresh reading
            if await wait_or_stop(stop, min(delay, _RECHECK_SECONDS)):
                return
            continue
        entry = crons[name]
        try:
            await enqueue(entry.task.name, tenant=CRON_TENANT, idempotency_key=tick_key(name, tick))
        except (StoreError, FairlaneError) as exc:
            # a refusal (a full queue or store: Rejected, StoreFull) loses this tick, not
            # the worker
            log.warning("cron %s: tick %s not enqueued: %s", name, tick.isoformat(), exc)
        upcoming[name] = next(CronSim(entry.schedule, tick))


async def _server_now(
    server_ms: Callable[[], Awaitable[int]], stop: asyncio.Event
) -> datetime | None:
    """The server's time as an aware datetime; None once ``stop`` is set while the
    server cannot be reached (it is asked again every second until then)."""
    while True:
        try:
            return datetime.fromtimestamp(await server_ms() / 1000, UTC)
        except StoreError as exc:
            log.warning("cron: cannot read the server's clock: %s", exc)
            if await wait_or_stop(stop, 1.0):
                return None
