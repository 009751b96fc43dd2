"""The worker's tenant sweep: what idle tenants left behind, removed pass by pass.

One pass (``Store.sweep_tenants``, ``lua/tenantsweep.lua``) looks at about
``tenants.sweep_batch`` of the shard's keys and per-tenant fields and deletes what the
rules of ``fairlane.policy.tenantstate`` say carries no information or has been idle for
``tenants.idle_ttl``. This module owns the repetition beside a worker's shard loops:
every ``tenants.sweep_interval`` (jittered, so that a fleet does not sweep in step) a
turn of passes that goes on from where the last turn stopped, at most ``_MAX_PASSES``
a turn, so that a cycle over a large keyspace spreads over several turns; an outage
is logged once and the turn given up.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Final

from fairlane.config.tenants import TenantSettings
from fairlane.runtime.lease import wait_or_stop
from fairlane.runtime.outage import Outage
from fairlane.store.api import Store
from fairlane.store.wire import StoreError

__all__ = ["TenantSweeper"]

log = logging.getLogger("fairlane.worker")
# passes a turn: a cycle that needs more goes on at the next turn, from its cursor
_MAX_PASSES: Final = 20
_JITTER: Final = 0.25


class TenantSweeper:
    """The tenant sweep of one shard for one worker: its cursor, its turns, its loop."""

    def __init__(self, store: Store, settings: TenantSettings) -> None:
        self.store = store
        self.settings = settings
        self.cursor = "0"
        #: passes run and state removed, over the sweeper's life
        self.passes = 0
        self.removed = 0
        self.cycles = 0
        self._warned_clock = False
        self._outage = Outage("tenant sweep", log)

    async def turn(self) -> int:
        """Up to ``_MAX_PASSES`` passes, ending early where a cycle ends; returns what was
        removed. Raises a ``StoreError`` when the store cannot take the call."""
        removed = 0
        for _ in range(_MAX_PASSES):
            swept = await self.store.sweep_tenants(
                self.cursor, self.settings.sweep_batch, self.settings.idle_ttl
            )
            self.passes += 1
            removed += swept.removed
            self.cursor = swept.cursor
            if not swept.idle_clock and not self._warned_clock:
                self._warned_clock = True
                log.warning(
                    "tenant sweep: the server keeps no idle times of keys (an LFU "
                    "maxmemory-policy), so idle tenants' learned costs and signals are "
                    "not removed"
                )
            if swept.cursor == "0":
                self.cycles += 1
                break
        self.removed += removed
        if removed:
            log.info("tenant sweep removed %d piece(s) of idle tenants' state", removed)
        return removed

    async def run(self, stop: asyncio.Event) -> None:
        """A turn every ``sweep_interval`` (jittered) until ``stop`` is set."""
        interval = self.settings.sweep_interval
        while not await wait_or_stop(
            stop, interval + random.uniform(-_JITTER * interval, _JITTER * interval)
        ):
            try:
                await self.turn()
            except StoreError as exc:
                self._outage.failed(exc)
            else:
                self._outage.recovered()
