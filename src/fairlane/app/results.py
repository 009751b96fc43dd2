"""The result listener: producers wait on finished jobs without polling.

One subscription per app, to every shard's done channel, however many waiters: the
first waiter opens it, and every finished job's notice wakes the waiters of that job,
who then read its record. A dropped connection is subscribed anew (what finished
meanwhile is only in the records, so every waiter re-reads), and a waiter re-reads
the record at least every ``RESULT_RECHECK_SECONDS``, so a lost notice costs a read,
never the caller's whole timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

from redis.asyncio.client import PubSub

from fairlane.errors import JobNotFound
from fairlane.runtime.outage import Outage
from fairlane.store.base import unavailable
from fairlane.store.connection import close_subscription
from fairlane.store.gate import StoreBusy
from fairlane.store.shards import ShardedStores
from fairlane.store.wire import StoreUnavailable

__all__ = ["RESULT_RECHECK_SECONDS", "ResultListener"]

log = logging.getLogger("fairlane")
#: how long a waiter trusts the result notice before it reads the job record again
RESULT_RECHECK_SECONDS = 10.0


class ResultListener:
    """Wakes the producers of one app waiting on its jobs' results."""

    def __init__(self, stores: ShardedStores, app_name: str) -> None:
        self._stores = stores
        self._name = app_name
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._pubsub: PubSub | None = None
        self._listener: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def aclose(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None
        if self._pubsub is not None:
            await close_subscription(self._pubsub)
            self._pubsub = None

    async def wait_finished(self, job_id: str) -> tuple[str, bytes, bytes]:
        """Wait (no polling) until a job is finished; returns (status, result, error)."""
        while True:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(job_id, []).append(fut)
            try:
                try:
                    await self._ensure_listener()
                    reply = await self._stores.store_for_job(job_id).watch(job_id)
                except (StoreUnavailable, StoreBusy):
                    # ride out an outage, or a pool whose connections are all taken (a
                    # failover can hold some until they time out): the caller's timeout
                    # bounds the wait
                    await asyncio.sleep(random.uniform(0.25, 0.75))
                    continue
                status = reply[0].decode()
                if status == "missing":
                    raise JobNotFound(f"no record of job {job_id}")
                if len(reply) == 3:
                    return status, reply[1], reply[2]
                # the notice normally wakes it; the bound makes a lost notice cost a
                # re-read of the record, never the caller's whole timeout
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(fut, RESULT_RECHECK_SECONDS)
            finally:
                waiting = self._waiters.get(job_id)
                if waiting and fut in waiting:
                    waiting.remove(fut)
                    if not waiting:
                        del self._waiters[job_id]

    async def _ensure_listener(self) -> None:
        if self._pubsub is not None:
            return
        # many waiters arrive at once (a gather of results): one of them subscribes, the
        # rest wait for it, rather than each opening a subscription of its own
        async with self._lock:
            if self._started():
                return
            pubsub = await self._stores.store.subscribe(*self._done_channels())
            self._pubsub = pubsub
            self._listener = asyncio.create_task(self._listen(pubsub), name="fairlane-results")

    def _started(self) -> bool:
        # a method, not an inline test: the attribute changes while a waiter awaits the lock
        return self._pubsub is not None

    async def _listen(self, pubsub: PubSub) -> None:
        outage = Outage(f"app {self._name}: result listener", log)
        while True:
            try:
                with unavailable():
                    message = await pubsub.get_message(timeout=30.0)
            except StoreUnavailable as exc:
                await asyncio.sleep(outage.failed(exc))
                # a new subscription, confirmed, rather than trusting the old object to
                # subscribe again on its next read: until it is, notices are lost
                pubsub = self._pubsub = await self._subscribe_again(pubsub, outage)
                outage.recovered()
                # what finished while we were not subscribed is only in the records
                self._wake_all()
                continue
            if message is None:
                continue
            job_id = message["data"].decode()
            for fut in self._waiters.pop(job_id, ()):
                if not fut.done():
                    fut.set_result(None)

    async def _subscribe_again(self, old: PubSub, outage: Outage) -> PubSub:
        with contextlib.suppress(Exception):
            await close_subscription(old)
        while True:
            try:
                return await self._stores.store.subscribe(*self._done_channels())
            except StoreUnavailable as exc:
                await asyncio.sleep(outage.failed(exc))

    def _done_channels(self) -> list[str]:
        return [store.keys.done_channel for store in self._stores.stores]

    def _wake_all(self) -> None:
        for futures in self._waiters.values():
            for fut in futures:
                if not fut.done():
                    fut.set_result(None)
        self._waiters.clear()
