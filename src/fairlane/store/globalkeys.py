"""A shard's calls for the global-key balancer (``store/lua/globalkeys.lua``).

The balancer (``runtime/balancer.py``) reads each shard's report of its global keys and
sends it orders, each call stamped with the pass's epoch (``fairlane.policy.globalkeys``
states the protocol). Epochs come from a counter in the app's home shard, so that two
balancers never share one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec

from fairlane.policy.globalkeys import KeyReport, Order
from fairlane.store.argv import GkEnableArg, GkOrderArg, GkReportArg, argv
from fairlane.store.base import StoreBase
from fairlane.store.wire import GkHeldField, GkOrderField, GkReportField

__all__ = ["GlobalKeyCalls", "Refused", "ShardReport"]

_PACK: Final = msgspec.msgpack.Encoder()
_UNPACK: Final = msgspec.msgpack.Decoder(list[list[Any]])

#: at most this many keys in one report
REPORT_LIMIT: Final = 10_000


class Refused(msgspec.Struct, frozen=True):
    """A shard refused a call: it has seen the newer epoch ``seen``."""

    seen: int


class ShardReport(msgspec.Struct, frozen=True):
    """A shard's global keys as one pass read them."""

    keys: dict[str, KeyReport]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _report(entry: list[Any]) -> tuple[str, KeyReport]:
    def at(field: GkReportField) -> Any:
        return entry[field - 1]

    limit = int(at(GkReportField.LIMIT))
    return _text(at(GkReportField.KEY)), KeyReport(
        part=float(_text(at(GkReportField.PART))),
        used=int(at(GkReportField.USED)),
        limit=limit if limit > 0 else None,
        waiting=int(at(GkReportField.WAITING)),
        weight=float(_text(at(GkReportField.WEIGHT))),
        active=bool(int(at(GkReportField.ACTIVE))),
        paused_until=int(at(GkReportField.PAUSED_UNTIL)),
    )


def _order(order: Order) -> list[Any]:
    fields = {
        GkOrderField.KEY: order.key,
        GkOrderField.PART: float(order.part),
        GkOrderField.PAUSED_UNTIL: int(order.paused_until),
    }
    return [fields[f] for f in GkOrderField]


class GlobalKeyCalls(StoreBase):
    """One shard's side of the balancer's passes."""

    async def enable_global_keys(self) -> None:
        """Make this shard's keys global: one part of each, given by the balancer (an
        app of many shards, before its workers dispatch)."""
        await self.fcall("gk_enable", self._common, argv(GkEnableArg, shards=self.shards))

    async def lead_balancer(self, worker: str, ttl_ms: int) -> bool:
        """Whether ``worker`` runs the balancer's passes for the next ``ttl_ms``: it takes
        the lead when nobody holds it, or keeps its own. (Two balancers at once would be
        safe, the epochs fence them; the lead only saves the work.)"""
        key = self.keys.balancer_lead
        # the leader asks most often: a GET and a renewal, where a failed SET NX came first
        holder = await self._call(self.client.get, key)
        if holder is not None and _text(holder) == worker:
            return bool(await self._call(self.client.pexpire, key, ttl_ms))
        if holder is not None:
            return False
        return bool(await self._call(self.client.set, key, worker, nx=True, px=ttl_ms))

    async def next_epoch(self) -> int:
        """A balancer epoch no pass had (the home shard's counter)."""
        return int(await self._call(self.client.incr, self.keys.balancer_epoch))

    async def epoch_past(self, seen: int) -> None:
        """Move the epoch counter past ``seen``, an epoch a shard has seen: a failover of
        the home shard may have lost the counter's last increments. An increment, never
        a write, so that it cannot move the counter back under another balancer."""
        now = int(await self._call(self.client.get, self.keys.balancer_epoch) or 0)
        if now <= seen:
            await self._call(self.client.incrby, self.keys.balancer_epoch, seen - now + 1)

    async def report_keys(self, epoch: int) -> ShardReport | Refused:
        """The shard's global keys, for a pass of ``epoch``; ``Refused`` when a newer
        pass has read the shard."""
        raw = await self.fcall(
            "gk_report",
            self._common,
            argv(GkReportArg, epoch=epoch, limit=REPORT_LIMIT, shards=self.shards),
        )
        if int(raw[0]) == 0:
            return Refused(int(raw[1]))
        if int(raw[0]) == 2:
            raise ValueError(
                f"shard {self.shard} uses more than {REPORT_LIMIT} global keys; the balancer "
                "reads them all in one report"
            )
        return ShardReport(dict(_report(e) for e in _UNPACK.decode(raw[1])))

    async def order_keys(self, epoch: int, orders: Sequence[Order]) -> dict[str, float] | Refused:
        """Apply a pass's orders; what the shard holds of each key now, or ``Refused``
        when a newer pass has read the shard."""
        raw = await self.fcall(
            "gk_order",
            self._common,
            argv(GkOrderArg, epoch=epoch, orders=_PACK.encode([_order(o) for o in orders])),
        )
        if int(raw[0]) == 0:
            return Refused(int(raw[1]))
        return {
            _text(e[GkHeldField.KEY - 1]): float(_text(e[GkHeldField.HELD - 1]))
            for e in _UNPACK.decode(raw[1])
        }
