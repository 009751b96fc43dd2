"""Cron: each worker computes the next tick and enqueues it with an idempotency key.

Every worker of the app runs this loop; the key ``cron:<task>:<tick>`` makes the
enqueue of one tick happen once however many workers race for it, and without any
lock or leader election.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from cronsim import CronSim

from fairlane.runtime.lease import wait_or_stop
from fairlane.store.redis import StoreUnavailable

if TYPE_CHECKING:
    from fairlane.app import CronEntry

__all__ = ["cron_loop", "tick_key"]

log = logging.getLogger("fairlane.cron")
CRON_TENANT = "cron"


def tick_key(task_name: str, tick: datetime) -> str:
    return f"cron:{task_name}:{int(tick.timestamp())}"


async def cron_loop(crons: Mapping[str, CronEntry], stop: asyncio.Event) -> None:
    if not crons:
        return
    now = datetime.now(UTC)
    upcoming = {name: next(CronSim(entry.schedule, now)) for name, entry in crons.items()}
    while True:
        name = min(upcoming, key=upcoming.__getitem__)
        tick = upcoming[name]
        delay = (tick - datetime.now(UTC)).total_seconds()
        if delay > 0 and await wait_or_stop(stop, delay):
            return
        entry = crons[name]
        try:
            await entry.task.enqueue(tenant=CRON_TENANT, idempotency_key=tick_key(name, tick))
        except StoreUnavailable as exc:
            log.warning("cron %s: tick %s not enqueued: %s", name, tick.isoformat(), exc)
        upcoming[name] = next(CronSim(entry.schedule, tick))
