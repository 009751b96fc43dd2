"""The global-key balancer: the passes that move a global key's parts between shards.

An app of many shards gives every shard a part of each key its tenants share
(``fairlane.policy.globalkeys`` states the rule, the protocol and its proof; the
shards' side is ``store/lua/globalkeys.lua``). Every worker of such an app runs this
loop; one of them at a time holds the lead (``gk:lead`` in the home shard, kept for
``_LEAD_PASSES`` passes) and runs a pass every ``interval`` seconds:

1. an epoch no pass had (the home shard's counter);
2. every shard's report, all at once;
3. the orders that lower parts (and carry a pause to every shard), all at once;
4. the orders that raise parts within what the lowers freed, all at once.

A shard that refuses a call (a newer epoch read it) ends the pass: another balancer
is running, or a failover of the home shard lost the counter's last increments, so the
counter is moved past the epoch the shard has seen before the next pass. A pass that
fails on an outage is logged once and the next one starts afresh; parts lowered and
not yet raised only leave capacity idle until then.
The traffic is a fixed number of calls a pass, whatever the job rate: one lead, one
epoch, one report per shard and at most two orders per shard.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Final

import msgspec

from fairlane.policy.globalkeys import Order, is_pool_key, plan_pass
from fairlane.runtime.lease import wait_or_stop
from fairlane.runtime.outage import Outage
from fairlane.store.api import Store
from fairlane.store.globalkeys import Refused, ShardReport
from fairlane.store.shards import ShardedStores
from fairlane.store.wire import StoreError

__all__ = ["DEFAULT_INTERVAL", "KeyBalancer", "PassResult"]

log = logging.getLogger("fairlane.worker")

#: seconds between passes: a shard's new demand gets its part within about two
DEFAULT_INTERVAL: Final = 0.2
#: the lead lasts this many passes without renewal, so a dead leader's successor
#: takes over within about a second
_LEAD_PASSES: Final = 5


class PassResult(msgspec.Struct, frozen=True):
    """What one pass did."""

    epoch: int
    keys: int  # global keys reported by any shard
    lowered: int  # orders that lowered a part or carried a pause
    raised: int  # orders that raised a part
    refused: bool  # a newer pass read a shard: this one stopped
    waiting: int = 0  # jobs parked on global keys (not pools), summed over the shards


class KeyBalancer:
    """The balancer loop of one worker over its app's shards (``stores``: their stores
    in order, or the app's sharded stores, read once connected)."""

    def __init__(
        self,
        stores: Sequence[Store] | ShardedStores,
        worker: str,
        *,
        interval: float = DEFAULT_INTERVAL,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        self._stores = stores
        self.worker = worker
        self.interval = interval
        self.passes = 0
        self.last: PassResult | None = None
        self._outage = Outage("global-key balancer", log)

    @property
    def stores(self) -> list[Store]:
        stores = self._stores
        return stores.stores if isinstance(stores, ShardedStores) else list(stores)

    @property
    def home(self) -> Store:
        return self.stores[0]

    async def enable(self) -> None:
        """Make every shard's keys global, before this worker dispatches."""
        await asyncio.gather(*(s.enable_global_keys() for s in self.stores))

    async def run_pass(self) -> PassResult:
        """One pass (the module docstring's four steps)."""
        epoch = await self.home.next_epoch()
        reports = await asyncio.gather(*(s.report_keys(epoch) for s in self.stores))
        read = [r for r in reports if isinstance(r, ShardReport)]
        if len(read) < len(reports):
            await self._refused(reports)
            return PassResult(epoch, 0, 0, 0, refused=True)
        plan = plan_pass([r.keys for r in read])
        waiting = sum(
            r.waiting for shard in read for key, r in shard.keys.items() if not is_pool_key(key)
        )
        answers = await self._send(epoch, plan.lowers)
        if answers is None:
            return PassResult(epoch, len(plan.holding), 0, 0, refused=True)
        raises = plan.raise_orders(answers)
        refused = await self._send(epoch, raises) is None
        return PassResult(
            epoch,
            len(plan.holding),
            sum(len(o) for o in plan.lowers),
            sum(len(o) for o in raises),
            refused,
            waiting,
        )

    async def _send(
        self, epoch: int, orders: Sequence[Sequence[Order]]
    ) -> list[dict[str, float]] | None:
        """Each shard's orders, all at once; each shard's held parts, or None when a
        shard refused the epoch."""

        async def one(store: Store, batch: Sequence[Order]) -> dict[str, float] | Refused:
            return await store.order_keys(epoch, batch) if batch else {}

        answers = await asyncio.gather(
            *(one(s, o) for s, o in zip(self.stores, orders, strict=True))
        )
        held = [a for a in answers if not isinstance(a, Refused)]
        if len(held) < len(answers):
            await self._refused(answers)
            return None
        return held

    async def _refused(self, answers: Sequence[object]) -> None:
        seen = max(a.seen for a in answers if isinstance(a, Refused))
        await self.home.epoch_past(seen)

    async def quiet(self) -> bool:
        """A pass now (a burst worker about to end: fenced like any other); whether it
        found no job parked on a global key. One that did has had its parts given."""
        try:
            result = await self.run_pass()
        except StoreError as exc:
            self._outage.failed(exc)
            return False
        return not result.refused and result.waiting == 0

    async def lead(self) -> bool:
        ttl_ms = round(self.interval * _LEAD_PASSES * 1000)
        return await self.home.lead_balancer(self.worker, ttl_ms)

    async def run(self, stop: asyncio.Event) -> None:
        """A pass every ``interval`` while this worker holds the lead, until ``stop``;
        the first at once, for the parts a restarted fleet's waiting jobs need."""
        while not stop.is_set():
            try:
                if await self.lead():
                    self.last = await self.run_pass()
                    self.passes += 1
            except StoreError as exc:
                self._outage.failed(exc)
            else:
                self._outage.recovered()
            if await wait_or_stop(stop, self.interval):
                return
