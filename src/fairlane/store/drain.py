"""Draining waiting jobs by a filter: the store's side (``lua/drain.lua``).

A drain cancels every waiting job a filter matches, however many, a bounded chunk per
call, so that the server serves every other client between two chunks. The jobs wait in
*sources*, one zset each (``DrainSource``): a tenant's queue of a class (queued), a
class's deferred index, or the tenant's deferred group when the filter names a tenant
(deferred), a lane's delayed set (scheduled), and the throttle waiters (throttled).
Without a tenant in the filter, the queues walked are those of the tenants active in
each class's fair set; with one, only that tenant's. ``drain_sources`` lists a shard's
sources for a filter, in the order jobs move between them (a scheduled, deferred or
throttled job becomes queued, never the other way but at dispatch), and ``drain_step``
runs one call on one source from a cursor: each job it matches is cancelled exactly as
``cancel`` cancels one (``control.cancel_job``), or only counted in a dry run.

A call stops once it has looked at ``limit`` entries or used ``budget_us`` of the
server's CPU time, checked between pages of 8 entries (a zset of 128 or fewer comes in
one page), so one call holds the server a bounded few milliseconds. A server that
gives scripts no CPU clock (Redis 7.0; 7.2 and Valkey do) bounds a call by 24 entries
instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import msgspec

from fairlane.store.argv import DrainArg, argv
from fairlane.store.base import StoreBase
from fairlane.store.pausing import PARKING_KINDS
from fairlane.store.wire import DrainReply, as_text, at

__all__ = [
    "CHUNK_BUDGET_US",
    "CHUNK_LIMIT",
    "WAITING_STATES",
    "DrainCalls",
    "DrainFilter",
    "DrainSource",
    "DrainStep",
]

#: the states a drain cancels, in the order their sources are walked: those a job leaves
#: for another (scheduled, deferred, throttled become queued) before the one it enters
WAITING_STATES: Final = ("scheduled", "deferred", "throttled", "queued")
#: entries one call looks at, at most
CHUNK_LIMIT: Final = 1000
#: the server's CPU time one call may take, in microseconds (checked between pages)
CHUNK_BUDGET_US: Final = 500
#: tenants read from a fair set per round trip
_TENANT_PAGE: Final = 1000


class DrainFilter(msgspec.Struct, frozen=True):
    """Which waiting jobs a drain takes: all those every given field matches (None:
    any). Times are the server's ms; a job enqueued at ``enqueued_before_ms`` is not
    taken, one at ``enqueued_after_ms`` is."""

    tenant: str | None = None
    fairness_key: str | None = None
    task: str | None = None
    lane: str | None = None
    service_class: str | None = None
    states: tuple[str, ...] = WAITING_STATES
    enqueued_after_ms: int | None = None
    enqueued_before_ms: int | None = None

    def __post_init__(self) -> None:
        unknown = set(self.states) - set(WAITING_STATES)
        if unknown:
            raise ValueError(
                f"a drain takes waiting jobs only ({', '.join(WAITING_STATES)}), "
                f"not {', '.join(sorted(unknown))}"
            )


class DrainSource(msgspec.Struct, frozen=True):
    """One zset of waiting jobs of one shard; '' fields are the filter's to decide."""

    state: str
    lane: str = ""
    service_class: str = ""
    tenant: str = ""
    parked: str = ""  # a queued source that is a pause's parked set: the pause's field


class DrainStep(msgspec.Struct, frozen=True):
    """One call's answer: where the next call goes on, and what this one did."""

    cursor: str
    seen: int  # entries looked at
    matched: int  # jobs cancelled, or counted in a dry run
    cpu_us: int = 0  # the server's CPU time the call took; -1: the server gives no clock

    @property
    def done(self) -> bool:
        """Whether the source is walked through."""
        return self.cursor == "0"


class DrainCalls(StoreBase):
    """One shard's waiting jobs, drained by a filter."""

    async def drain_sources(
        self, lanes: Mapping[str, Sequence[str]], flt: DrainFilter
    ) -> list[DrainSource]:
        """The sources that may hold jobs ``flt`` matches, in walking order: of the lanes
        and classes in ``lanes`` (each lane to the classes of its table), those the
        filter names. The throttle waiters are one source for every lane, which the
        filter's lane and class then pick among."""
        found: list[DrainSource] = []
        tenant, cls = flt.tenant or "", flt.service_class or ""
        walked = {
            lane: [c for c in classes if c == (flt.service_class or c)]
            for lane, classes in lanes.items()
            if lane == (flt.lane or lane)
        }
        for state in WAITING_STATES:
            if state not in flt.states:
                continue
            if state == "throttled":
                found.append(DrainSource(state, flt.lane or "", cls, tenant))
            for lane, classes in walked.items():
                if state == "scheduled" and classes:
                    found.append(DrainSource(state, lane, cls, tenant))
                elif state == "deferred":
                    found.extend(DrainSource(state, lane, c, tenant) for c in classes)
                elif state == "queued":
                    for c in classes:
                        active = [tenant] if tenant else await self._active_tenants(lane, c)
                        found.extend(DrainSource(state, lane, c, t) for t in active)
            if state == "queued":
                # a paused task's or key's jobs wait in its parked set (store/pausing.py)
                for fld in await self._parked_fields():
                    found.append(DrainSource(state, flt.lane or "", cls, tenant, fld))
        return found

    async def _parked_fields(self) -> list[str]:
        """The fields of the pauses that may hold parked jobs (a task's, a key's)."""
        fields = await self._call(self.client.hkeys, self.keys.pauses)
        return sorted(f for f in map(as_text, fields) if f[0] in PARKING_KINDS)

    async def _active_tenants(self, lane: str, service_class: str) -> list[str]:
        """The tenants with jobs queued in a class: its fair set, a page per round trip
        (one long read would hold the server as long as a drain call may), and the
        tenants a pause holds out of it."""
        key = self.keys.class_key(lane, service_class, "fair")
        tenants: list[str] = []
        while True:
            start = len(tenants)
            page = await self._call(self.client.zrange, key, start, start + _TENANT_PAGE - 1)
            tenants.extend(as_text(t) for t in page)
            if len(page) < _TENANT_PAGE:
                break
        held = await self._call(
            self.client.smembers, self.keys.class_key(lane, service_class, "held")
        )
        return tenants + sorted(set(map(as_text, held)) - set(tenants))

    async def drain_step(
        self,
        source: DrainSource,
        flt: DrainFilter,
        cursor: str = "0",
        *,
        dry_run: bool = False,
        limit: int = CHUNK_LIMIT,
        budget_us: int = CHUNK_BUDGET_US,
    ) -> DrainStep:
        """One bounded call on ``source`` from ``cursor`` ('0': its start)."""
        args = argv(
            DrainArg,
            state=source.state,
            lane=source.lane,
            service_class=source.service_class,
            tenant=source.tenant,
            cursor=cursor,
            limit=limit,
            budget_us=budget_us,
            dry_run="1" if dry_run else "0",
            task=flt.task or "",
            fairness_key=flt.fairness_key or "",
            after_ms=_ms(flt.enqueued_after_ms),
            before_ms=_ms(flt.enqueued_before_ms),
            parked=source.parked,
        )
        reply = await self.fcall("drain", self._common, args)
        return DrainStep(
            as_text(at(reply, DrainReply.CURSOR)),
            int(at(reply, DrainReply.SEEN)),
            int(at(reply, DrainReply.MATCHED)),
            int(at(reply, DrainReply.CPU_US)),
        )


def _ms(value: int | None) -> str:
    return "" if value is None else str(value)
