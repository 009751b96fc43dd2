"""The worker's payload sweep: a pass over the ``payloads`` index every interval.

The pass itself (``fairlane.payloads.sweep.sweep_once``) needs no loop and no clock
of its own; this module owns the repetition a worker runs beside its shard loops:
wait an interval, sweep until a pass comes back short, log and carry on when the
server or the payload store fails.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

from fairlane.errors import StoreFull
from fairlane.payloads.base import PayloadError
from fairlane.payloads.offload import Payloads
from fairlane.payloads.sweep import sweep_once
from fairlane.runtime.lease import wait_or_stop
from fairlane.store.api import Store
from fairlane.store.wire import StoreError

__all__ = ["payload_sweep_loop"]

log = logging.getLogger("fairlane.worker")
# a sweep that keeps coming back full yields after this many passes until its next turn
_MAX_PASSES: Final = 20


async def payload_sweep_loop(
    server: Store, payloads: Payloads, interval: float, stop: asyncio.Event
) -> None:
    """Sweep every ``interval`` seconds until ``stop`` is set."""
    batch = payloads.settings.sweep_batch
    while not await wait_or_stop(stop, interval):
        for _ in range(_MAX_PASSES):
            try:
                checked, removed = await sweep_once(server, payloads, int(time.time() * 1000))
            except (StoreError, StoreFull, PayloadError, OSError) as exc:
                log.warning("payload sweep failed: %s", exc)
                break
            except Exception:  # a store's unexpected error must not stop the worker
                log.exception("payload sweep failed")
                break
            if removed:
                log.info("removed %d payload(s) whose job records are gone", removed)
            if checked < batch:
                break
