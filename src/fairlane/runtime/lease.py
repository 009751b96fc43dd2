"""Keeping leases and taking them back: renewal of held jobs, reclaim sweeps.

A worker beats once per ``heartbeat_interval`` from a thread of its own
(``runtime/beating.py``); a worker that beat and then stays silent for
``worker_timeout`` is dead, and the next beat of another worker takes its jobs back at
once. Leases are the loop's side: a worker renews every lease it holds in one call
per ``renew_interval``; the reply says which leases it has lost (its writes for those
would be fenced anyway, so it stops them) and which jobs users asked to cancel. Sweeps
reclaim expired leases (a worker alive but stuck, or one that never beat): jittered so
a fleet does not sweep in lockstep, bounded in work per pass, and repeated at once
while a pass comes back full.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence

from fairlane.config.settings import LeaseSettings
from fairlane.runtime.outage import Outage
from fairlane.store.api import Store
from fairlane.store.gate import raise_if_cancelling
from fairlane.store.wire import StoreError

__all__ = ["renew_loop", "sweep_loop", "wait_or_stop"]

log = logging.getLogger("fairlane.worker")
# a worker whose heartbeat is older than this many lease lengths is dropped from the registry
_STALE_WORKER_LEASES = 3
_MAX_PASSES = 20


async def wait_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` unless ``stop`` is set first; True when stopping."""
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        # the deadline and a cancel in one turn of the loop: the cancel wins
        raise_if_cancelling()
        return False
    return True


async def renew_loop(
    *,
    store: Store,
    worker_id: str,
    lease: LeaseSettings,
    held: Callable[[], Sequence[tuple[str, str]]],
    on_lost: Callable[[list[tuple[str, str]]], None],
    on_cancel: Callable[[list[str]], None],
    stop: asyncio.Event,
    on_renewed: Callable[[float], None] | None = None,
) -> None:
    """Renew the held leases every ``renew_interval``; ``on_renewed`` is told when each
    successful renewal was sent (the leases run from then)."""
    lease_ms = round(lease.duration * 1000)
    # renewals keep their own pace through an outage: the interval is already short
    outage = Outage(f"worker {worker_id}: renewing leases", log)
    while True:
        sent = list(held())
        began = time.monotonic()
        try:
            lost, cancel = await store.renew(worker_id, lease_ms, sent)
        except StoreError as exc:
            outage.failed(exc)
        else:
            outage.recovered()
            if on_renewed is not None:
                on_renewed(began)
            if lost:
                # with the token each lease had when sent: by the reply, the same job may
                # hold a new lease here (a retry, or a workflow's next slice), which stays
                tokens = dict(sent)
                on_lost([(job_id, tokens[job_id]) for job_id in lost if job_id in tokens])
            if cancel:
                on_cancel(cancel)
        if await wait_or_stop(stop, lease.renew_interval):
            return


async def sweep_loop(store: Store, lease: LeaseSettings, stop: asyncio.Event) -> None:
    stale_ms = round(lease.duration * 1000 * _STALE_WORKER_LEASES)
    outage = Outage("reclaim sweep", log)
    while True:
        spread = lease.sweep_interval * lease.sweep_jitter
        if await wait_or_stop(stop, lease.sweep_interval + random.uniform(-spread, spread)):
            return
        for _ in range(_MAX_PASSES):
            try:
                retried, dead = await store.sweep(
                    lease.sweep_batch, random.getrandbits(31), stale_ms
                )
            except StoreError as exc:
                outage.failed(exc)
                break
            outage.recovered()
            if retried or dead:
                log.info(
                    "reclaimed %d expired leases (%d dead-lettered)",
                    len(retried) + len(dead),
                    len(dead),
                )
            if len(retried) + len(dead) < lease.sweep_batch:
                break
