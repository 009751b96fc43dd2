"""An operator's pauses: stop dispatch for a tenant, a fairness key, a task or a lane, and
refuse a tenant's submissions for a while (``fairlane.policy.pauses`` states the rules).

``app.pauses`` pauses and resumes any scope; ``app.tenants.pause(...)``,
``resume(...)`` and ``quarantine(...)`` are the tenant's shorthands. A tenant's scopes
live in its shard; a task's and a lane's in every shard, so that each shard's dispatch
step decides them atomically. Every action is checked before anything is written (an
unknown task, lane, class or tenant, an expiry that is not in the future: ``ValueError``,
nothing changed) and recorded in the audit trail with who, what, why and counts.
"""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta

import msgspec

from fairlane.policy.pauses import Scope, ScopeKind, scope_text
from fairlane.registry.declared import Registry
from fairlane.store.api import Store
from fairlane.store.pausing import PauseEntry, scope_field
from fairlane.store.shards import ShardedStores

__all__ = ["PauseReport", "Pauses", "ResumeReport", "TenantPauses", "scope_text"]

#: the longest pause an expiry may ask for (a year): beyond it, pause until resumed
MAX_FOR_S = 366 * 24 * 3600.0


class PauseReport(msgspec.Struct, frozen=True):
    """What a pause did."""

    scope: Scope
    until_ms: int  # its end, server ms (0: until resumed)
    running_asked: int  # running jobs asked to stop (``cancel_running``)
    already: bool  # it was paused already (its end and reason replaced)


class ResumeReport(msgspec.Struct, frozen=True):
    """What a resume did."""

    scope: Scope
    was_paused: bool
    moved_back: int  # parked jobs put back in their queues (a task's or key's pause)


def _for_ms(for_: timedelta | float | None) -> int:
    if for_ is None:
        return 0
    seconds = for_.total_seconds() if isinstance(for_, timedelta) else for_
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"for_ must be a timedelta or seconds, got {for_!r}")
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_FOR_S):
        raise ValueError(
            f"a pause's expiry must be in the future and at most a year away, got {seconds!r} s"
        )
    return max(1, round(seconds * 1000))


class Pauses:
    """Pause and resume dispatch, and quarantine tenants, for one app."""

    def __init__(self, stores: ShardedStores, registry: Registry) -> None:
        self._stores = stores
        self._registry = registry

    def scope(
        self,
        *,
        tenant: str | None = None,
        fairness_key: str | None = None,
        task: str | None = None,
        lane: str | None = None,
        cls: str | None = None,
        refuse: bool = False,
    ) -> Scope:
        """The one scope these names make, checked against the app's declarations."""
        if task is not None and not (tenant or fairness_key or lane or cls):
            if task not in self._registry.tasks:
                near = [n for n in self._registry.tasks if n.rsplit(".", 1)[-1] == task]
                hint = f" (did you mean {' or '.join(map(repr, near))}?)" if near else ""
                raise ValueError(f"unknown task {task!r}: this app declares no such task{hint}")
            return Scope(ScopeKind.TASK, task=task)
        if lane is not None and not (tenant or fairness_key or task):
            if lane not in self._registry.lanes_in_use():
                raise ValueError(f"unknown lane {lane!r}: no task or declaration names it")
            if cls and cls not in self._registry.lane_classes(lane).names:
                raise ValueError(f"lane {lane!r} has no class {cls!r}")
            return Scope(ScopeKind.LANE, lane=lane, cls=cls or "")
        if tenant and not (task or lane or cls):
            if fairness_key:
                return Scope(ScopeKind.KEY, tenant=tenant, key=fairness_key)
            return Scope(ScopeKind.REFUSE if refuse else ScopeKind.TENANT, tenant=tenant)
        raise ValueError(
            "name one scope: a tenant (optionally one of its fairness keys), a task, or a "
            "lane (optionally one of its classes)"
        )

    def _stores_of(self, scope: Scope) -> list[Store]:
        if scope.tenant:
            return [self._stores.store_for_tenant(scope.tenant)]
        return self._stores.stores

    async def known_tenant(self, tenant: str) -> bool:
        """Whether the store has anything of ``tenant``: a setting, or work waiting."""
        store = self._stores.store_for_tenant(tenant)
        lanes = {lane: self._registry.lane_classes(lane).names for lane in self._lanes()}
        return await store.tenant_seen(tenant, lanes)

    def _lanes(self) -> list[str]:
        return self._registry.lanes_in_use()

    async def pause(
        self,
        scope: Scope,
        *,
        reason: str = "",
        for_: timedelta | float | None = None,
        cancel_running: bool = False,
        by: str = "",
        check_tenant: bool = True,
    ) -> PauseReport:
        """Put ``scope``'s pause in force on every shard it lives in (its end and reason
        replaced when it was paused already)."""
        for_ms = _for_ms(for_)
        if scope.tenant and check_tenant and not await self.known_tenant(scope.tenant):
            raise ValueError(
                f"unknown tenant {scope.tenant!r}: the store holds no setting and no work of it"
            )
        done = await asyncio.gather(
            *(
                store.pause(
                    scope,
                    for_ms=for_ms,
                    reason=reason,
                    by=by,
                    cancel_running=cancel_running,
                    lanes=self._lanes(),
                )
                for store in self._stores_of(scope)
            )
        )
        report = PauseReport(
            scope,
            max(d.until_ms for d in done),
            sum(d.running_asked for d in done),
            not any(d.new for d in done),
        )
        detail = f"{scope_text(scope)}; {reason}".strip("; ")[:200]
        outcome = "quarantined" if scope.kind == ScopeKind.REFUSE else "paused"
        await self._audit(by, scope, outcome, detail)
        return report

    async def resume(self, scope: Scope, *, by: str = "", reason: str = "") -> ResumeReport:
        """End ``scope``'s pause on every shard and give back what it held (a task's or
        key's parked jobs go back to their places, a chunk a call)."""
        results = await asyncio.gather(*(self._resume_on(s, scope) for s in self._stores_of(scope)))
        report = ResumeReport(scope, any(was for was, _ in results), sum(n for _, n in results))
        if report.was_paused:
            detail = f"{scope_text(scope)}; {report.moved_back} parked jobs back; {reason}"
            await self._audit(by, scope, "resumed", detail.strip("; ")[:200])
        return report

    @staticmethod
    async def _resume_on(store: Store, scope: Scope) -> tuple[bool, int]:
        before = {scope_field(e.scope): e.parked for e in await store.pause_entries()}
        was, left = await store.resume_step(scope)
        while left:
            _, left = await store.resume_step(scope)
        return was, before.get(scope_field(scope), 0)

    async def list(self) -> list[PauseEntry]:
        """Every pause in force or being lifted, over the app's shards (a task's or lane's
        pause once, its parked jobs summed)."""
        merged: dict[Scope, PauseEntry] = {}
        for entries in await asyncio.gather(*(s.pause_entries() for s in self._stores.stores)):
            for e in entries:
                seen = merged.get(e.scope)
                if seen is None:
                    merged[e.scope] = e
                else:
                    merged[e.scope] = PauseEntry(
                        e.scope,
                        max(seen.until_ms, e.until_ms),
                        seen.reason,
                        seen.by,
                        seen.at_ms,
                        seen.parked + e.parked,
                    )
        return sorted(merged.values(), key=lambda e: (e.scope.kind, scope_field(e.scope)))

    async def _audit(self, by: str, scope: Scope, outcome: str, detail: str) -> None:
        await self._stores.store.key_records.audit.record(
            "pause" if outcome != "resumed" else "resume",
            by or "operator",
            scope.tenant,
            outcome,
            detail=detail,
        )


class TenantPauses:
    """``app.tenants.pause(...)``, ``resume(...)`` and ``quarantine(...)``."""

    def __init__(self, pauses: Pauses) -> None:
        self._pauses = pauses

    async def pause(
        self,
        tenant: str,
        *,
        reason: str = "",
        for_: timedelta | float | None = None,
        refuse_submissions: bool = False,
        cancel_running: bool = False,
        by: str = "",
    ) -> PauseReport:
        """Nothing of ``tenant``'s starts until resumed (or ``for_`` runs out); its waiting
        jobs keep their places, running ones finish (``cancel_running``: they are asked to
        stop at their next lease renewal). ``refuse_submissions`` also quarantines it."""
        p = self._pauses
        report = await p.pause(
            p.scope(tenant=tenant),
            reason=reason,
            for_=for_,
            cancel_running=cancel_running,
            by=by,
        )
        if refuse_submissions:
            await self.quarantine(tenant, reason=reason, for_=for_, by=by)
        return report

    async def quarantine(
        self, tenant: str, *, reason: str = "", for_: timedelta | float | None = None, by: str = ""
    ) -> PauseReport:
        """Refuse ``tenant``'s new submissions until resumed (or ``for_`` runs out):
        ``submit`` answers ``rejected`` with reason ``tenant_paused`` and a Retry-After up to
        the quarantine's end, ``enqueue`` raises ``Rejected``, the gateway answers 429;
        nothing is stored. Its waiting work still runs unless it is paused too."""
        p = self._pauses
        return await p.pause(p.scope(tenant=tenant, refuse=True), reason=reason, for_=for_, by=by)

    async def resume(self, tenant: str, *, by: str = "") -> ResumeReport:
        """End ``tenant``'s pause and its quarantine; its held work is dispatched again, at
        a fair place (``fairlane.policy.pauses``, P2)."""
        p = self._pauses
        quarantine = await p.resume(p.scope(tenant=tenant, refuse=True), by=by)
        report = await p.resume(p.scope(tenant=tenant), by=by)
        if quarantine.was_paused and not report.was_paused:
            return quarantine
        return report
