"""Draining an app: every waiting job a filter matches cancelled, however many.

``App.drain`` checks the filter against what the app declared (a task of that name, a
lane the app uses, a class of its lanes' tables, waiting states only) and then walks the
shards that may hold the jobs -- the tenant's, or every shard -- source by source, one
bounded call at a time (``fairlane.store.drain``): the server serves every other client
between two calls, and each job is cancelled exactly as ``Job.cancel`` would cancel it.
A dry run walks the same way and only counts.

The jobs taken are those enqueued before the drain began (by each shard's clock):
a tenant that goes on submitting does not keep a drain going. A job may move from one
source to another while the walk goes (a scheduled job comes due, a throttled one is
woken); a round that cancelled anything is followed by another, up to ``MAX_ROUNDS``,
which finds what moved. The drain is idempotent by its filter: cut off half-way, it is
finished by running it again. A drain that cancels (not a dry run) is written to the
app's audit trail (``fairlane.store.audit``) when it starts and when it ends, with who
asked, the filter and the counts.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Final

import msgspec

from fairlane.registry import Registry
from fairlane.store.api import Store
from fairlane.store.audit import AuditTrail
from fairlane.store.drain import (
    CHUNK_BUDGET_US,
    WAITING_STATES,
    DrainFilter,
    DrainStep,
)
from fairlane.store.shards import ShardedStores

__all__ = [
    "MAX_ROUNDS",
    "DrainProgress",
    "DrainReport",
    "Moment",
    "Progress",
    "describe",
    "drain_filter",
    "run_drain",
]

#: rounds a drain walks at most: the first, and those after a round that cancelled jobs
MAX_ROUNDS: Final = 3
#: a time in a filter: seconds since the epoch, or a timezone-aware datetime
Moment = float | datetime


class DrainProgress(msgspec.Struct, frozen=True):
    """Where a drain is: its counts so far (``matched``: cancelled, or counted in a
    dry run), the shard, round and source it is on, and the server's CPU time of the
    call just made (-1: the server gives scripts no clock)."""

    dry_run: bool
    matched: int
    seen: int
    calls: int
    shard: int
    round: int
    source: int  # sources walked through in this round of this shard
    sources: int  # sources of this round of this shard
    call_us: int = 0


class DrainReport(msgspec.Struct, frozen=True):
    """What a drain did: ``matched`` jobs cancelled (a dry run: would be), ``seen``
    entries looked at, in ``calls`` calls over ``rounds`` rounds of ``shards`` shards;
    ``longest_call_us``: the server's CPU time of its longest call."""

    filter: str
    dry_run: bool
    matched: int
    seen: int
    calls: int
    rounds: int
    shards: int
    seconds: float
    longest_call_us: int = 0

    @property
    def cancelled(self) -> int:
        return 0 if self.dry_run else self.matched


#: told of each call's progress; may be a coroutine function
Progress = Callable[[DrainProgress], Awaitable[None] | None]


def _ms(moment: Moment | None, name: str) -> int | None:
    if moment is None:
        return None
    if isinstance(moment, datetime):
        if moment.tzinfo is None:
            raise ValueError(f"{name} must be timezone-aware (e.g. datetime.now(UTC)): {moment!r}")
        return round(moment.timestamp() * 1000)
    if isinstance(moment, bool) or not isinstance(moment, int | float):
        raise TypeError(f"{name} is seconds since the epoch or a datetime, not {moment!r}")
    return round(moment * 1000)


def _states(state: str | Sequence[str] | None) -> tuple[str, ...]:
    if state is None:
        return WAITING_STATES
    asked = (state,) if isinstance(state, str) else tuple(state)
    for name in asked:
        if name == "running":
            raise ValueError(
                "a drain cancels waiting jobs only: a running job is cancelled by its id "
                "(Job.cancel), which asks its worker to stop"
            )
        if name not in WAITING_STATES:
            raise ValueError(f"no waiting state {name!r}: one of {', '.join(WAITING_STATES)}")
    if not asked:
        raise ValueError("no state named: give one of " + ", ".join(WAITING_STATES))
    return tuple(s for s in WAITING_STATES if s in asked)


def drain_filter(
    registry: Registry,
    *,
    tenant: str | None = None,
    fairness_key: str | None = None,
    task: str | None = None,
    lane: str | None = None,
    service_class: str | None = None,
    state: str | Sequence[str] | None = None,
    enqueued_after: Moment | None = None,
    enqueued_before: Moment | None = None,
) -> DrainFilter:
    """The filter, checked against what the app declared: ``UnknownTask`` for a task it
    has not, ``ValueError`` for a lane it does not use, a class of none of its lanes
    (of ``lane``'s, when given), a state that is not waiting, or an empty time window."""
    if task is not None:
        registry.get(task)
    lanes = registry.lanes_in_use()
    if lane is not None and lane not in lanes:
        raise ValueError(f"app {registry.name!r} has no lane {lane!r}: {', '.join(lanes)}")
    if service_class is not None:
        classes = {c.name for name in [lane] if name for c in registry.lane_classes(name)}
        classes = classes or {c.name for name in lanes for c in registry.lane_classes(name)}
        if service_class not in classes:
            where = f"lane {lane!r}" if lane else f"the lanes of app {registry.name!r}"
            raise ValueError(f"no class {service_class!r} in {where}: {', '.join(sorted(classes))}")
    after, before = _ms(enqueued_after, "enqueued_after"), _ms(enqueued_before, "enqueued_before")
    if after is not None and before is not None and after >= before:
        raise ValueError("enqueued_after must be earlier than enqueued_before: no job is both")
    for name, value in (("tenant", tenant), ("fairness_key", fairness_key)):
        if value is not None and not value:
            raise ValueError(f"{name} is a name, not ''")
    return DrainFilter(
        tenant=tenant,
        fairness_key=fairness_key,
        task=task,
        lane=lane,
        service_class=service_class,
        states=_states(state),
        enqueued_after_ms=after,
        enqueued_before_ms=before,
    )


def describe(flt: DrainFilter) -> str:
    """The filter as one line: ``tenant=a task=x state=queued,deferred``, or ``all``."""
    parts = [
        f"{name}={value}"
        for name, value in (
            ("tenant", flt.tenant),
            ("fairness_key", flt.fairness_key),
            ("task", flt.task),
            ("lane", flt.lane),
            ("class", flt.service_class),
            ("after_ms", flt.enqueued_after_ms),
            ("before_ms", flt.enqueued_before_ms),
        )
        if value is not None
    ]
    if flt.states != WAITING_STATES:
        parts.append("state=" + ",".join(flt.states))
    return " ".join(parts) or "all waiting jobs"


class _Walk(msgspec.Struct):
    """A drain under way: its counts, and whom to tell."""

    dry_run: bool
    progress: Progress | None
    budget_us: int
    pause: float
    matched: int = 0
    seen: int = 0
    calls: int = 0
    rounds: int = 0
    longest_us: int = 0

    async def tell(self, shard: int, done: int, sources: int, call_us: int) -> None:
        if self.progress is None:
            return
        told = self.progress(
            DrainProgress(
                self.dry_run,
                self.matched,
                self.seen,
                self.calls,
                shard,
                self.rounds,
                done,
                sources,
                call_us,
            )
        )
        if inspect.isawaitable(told):
            await told

    def next_budget(self, budget: int, used_us: int) -> int:
        """The next call's budget: what the cancels free (reservations, retention's trim)
        is applied after the budget is looked at, and costs in proportion to the jobs
        cancelled, so a call that took more than ``budget_us`` in all gives the next a
        budget cut in that proportion (never below a tenth), one that took less has it
        grow back."""
        if used_us <= 0:
            return budget
        scaled = budget * self.budget_us // used_us
        return max(self.budget_us // 10, min(self.budget_us, scaled))

    async def shard(self, store: Store, lanes: dict[str, list[str]], flt: DrainFilter) -> None:
        """Walk one shard in rounds: the jobs enqueued before now, by its clock."""
        started = await store.server_time_ms() + 1
        before = flt.enqueued_before_ms
        flt = msgspec.structs.replace(
            flt, enqueued_before_ms=started if before is None else min(before, started)
        )
        for round_no in range(1, MAX_ROUNDS + 1):
            self.rounds = max(self.rounds, round_no)
            sources = await store.drain_sources(lanes, flt)
            taken = 0
            for done, source in enumerate(sources):
                step, budget = DrainStep("0", 0, 0), self.budget_us
                while True:
                    step = await store.drain_step(
                        source, flt, step.cursor, dry_run=self.dry_run, budget_us=budget
                    )
                    budget = self.next_budget(budget, step.cpu_us)
                    self.calls, self.seen = self.calls + 1, self.seen + step.seen
                    self.longest_us = max(self.longest_us, step.cpu_us)
                    self.matched, taken = self.matched + step.matched, taken + step.matched
                    await self.tell(store.shard, done + step.done, len(sources), step.cpu_us)
                    if step.done:
                        break
                    # the server serves the others between two calls; a pause gives them more
                    await asyncio.sleep(self.pause)
            if self.dry_run or taken == 0:
                return


async def run_drain(
    stores: ShardedStores,
    registry: Registry,
    flt: DrainFilter,
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
    actor: str = "api",
    audit: AuditTrail | None = None,
    budget_us: int = CHUNK_BUDGET_US,
    pause: float = 0.0,
) -> DrainReport:
    """Drain ``flt``'s jobs from every shard they may be in (``App.drain``)."""
    began = time.monotonic()
    lanes = {
        lane: [c.name for c in registry.lane_classes(lane)] for lane in registry.lanes_in_use()
    }
    shards = [stores.store_for_tenant(flt.tenant)] if flt.tenant else stores.stores
    walk = _Walk(dry_run, progress, budget_us, pause)
    text = describe(flt)
    if audit is not None and not dry_run:
        await audit.record("drain", actor, flt.tenant or "", "started", detail=text)
    for store in shards:
        await walk.shard(store, lanes, flt)
    report = DrainReport(
        text,
        dry_run,
        walk.matched,
        walk.seen,
        walk.calls,
        walk.rounds,
        len(shards),
        time.monotonic() - began,
        walk.longest_us,
    )
    if audit is not None and not dry_run:
        counts = f"cancelled={report.matched} seen={report.seen} calls={report.calls}"
        await audit.record("drain", actor, flt.tenant or "", "done", detail=f"{counts} {text}")
    return report
