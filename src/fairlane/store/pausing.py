"""A shard's side of an operator's pauses (``store/lua/pausetable.lua``, ``pauses.lua``).

A pause's scope (``fairlane.policy.pauses.Scope``) is one field of the shard's pause
table: its kind (``PauseField``), ``:`` and its names, a second one after a zero byte.
Tenant and key names may hold any character but the zero byte, so a field reads back
to the scope it was made from.
"""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec

from fairlane.policy.pauses import LIFT_BUDGET, Scope, ScopeKind
from fairlane.store.argv import PauseArg, ResumeArg, UnofferArg, argv
from fairlane.store.base import StoreBase
from fairlane.store.keys import RECORD_DEFAULTS
from fairlane.store.wire import PauseField

__all__ = [
    "PARKING_KINDS",
    "PauseCalls",
    "PauseEntry",
    "PauseSet",
    "field_scope",
    "scope_field",
]

#: the kinds of pause whose jobs wait in a parked set (a task's, a key's)
PARKING_KINDS: Final = frozenset({PauseField.TASK.value, PauseField.KEY.value})
#: throttle-hash fields a pause's offer sweep reads per call
SCAN_PAGE: Final = 1000

_KINDS: Final = {
    ScopeKind.TENANT: PauseField.TENANT,
    ScopeKind.KEY: PauseField.KEY,
    ScopeKind.TASK: PauseField.TASK,
    ScopeKind.LANE: PauseField.LANE,
    ScopeKind.REFUSE: PauseField.REFUSE,
}
_SCOPES: Final = {v.value: k for k, v in _KINDS.items()}


def _check_name(name: str) -> str:
    if "\0" in name:
        raise ValueError(f"a name in a pause may not hold a zero byte: {name!r}")
    return name


def scope_field(scope: Scope) -> str:
    """The scope's field in the pause table."""
    kind = _KINDS[scope.kind].value
    if scope.kind == ScopeKind.KEY:
        return f"{kind}:{_check_name(scope.tenant)}\0{_check_name(scope.key)}"
    if scope.kind == ScopeKind.LANE:
        return f"{kind}:{_check_name(scope.lane)}\0{_check_name(scope.cls)}"
    if scope.kind == ScopeKind.TASK:
        return f"{kind}:{_check_name(scope.task)}"
    return f"{kind}:{_check_name(scope.tenant)}"


def field_scope(field: str) -> Scope:
    """The scope a field of the pause table names."""
    kind = _SCOPES[field[0]]
    first, _, second = field[2:].partition("\0")
    if kind == ScopeKind.KEY:
        return Scope(kind, tenant=first, key=second)
    if kind == ScopeKind.LANE:
        return Scope(kind, lane=first, cls=second)
    if kind == ScopeKind.TASK:
        return Scope(kind, task=first)
    return Scope(kind, tenant=first)


class PauseSet(msgspec.Struct, frozen=True):
    """What a pause call did on one shard."""

    new: bool  # False: the scope was paused already (its end and reason replaced)
    running_asked: int  # running jobs asked to stop (``cancel_running``)
    until_ms: int  # its end, server ms (0: until resumed)


class PauseEntry(msgspec.Struct, frozen=True):
    """A pause as the shard holds it."""

    scope: Scope
    until_ms: int  # 0: until resumed; 1: ended, being lifted
    reason: str
    by: str
    at_ms: int
    parked: int  # jobs of a task or key pause waiting in its parked set


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class PauseCalls(StoreBase):
    """Pause and resume on one shard."""

    async def pause(
        self,
        scope: Scope,
        *,
        for_ms: int = 0,
        reason: str = "",
        by: str = "",
        cancel_running: bool = False,
        lanes: list[str],
    ) -> PauseSet:
        """Put ``scope``'s pause in force on this shard (``lanes``: every lane of the app,
        whose state is flagged so that dispatch and enqueue read the pause table)."""
        why = json.dumps({"reason": reason, "by": by}, separators=(",", ":"))
        raw = await self.fcall(
            "pause",
            self._common,
            argv(
                PauseArg,
                *lanes,
                field=scope_field(scope),
                for_ms=max(0, int(for_ms)),
                why=why,
                cancel_running=int(cancel_running),
            ),
        )
        if scope.kind != ScopeKind.REFUSE:
            await self._take_back_offers()
        return PauseSet(bool(int(raw[0])), int(raw[1]), int(raw[2]))

    async def _take_back_offers(self) -> None:
        """Jobs a throttle key woke before the pause, and that wait with its offers, give
        them back if the pause holds them (P4), in the order of their ids (the order
        decides which waiters the offers go to next). The throttle hash is scanned a page
        at a time; the woken jobs are few (at most the keys' limits), so they are sent in
        calls of a page each."""
        woken: set[str] = set()
        cursor: int | bytes = 0
        while True:
            cursor, fields = await self._call(
                self.client.hscan, self.keys.throttles, cursor, match="w:*", count=SCAN_PAGE
            )
            woken.update(_text(f)[2:] for f in fields)
            if not int(cursor):
                break
        ids = sorted(woken)
        for i in range(0, len(ids), SCAN_PAGE):
            await self.take_back_offers(ids[i : i + SCAN_PAGE])

    async def take_back_offers(self, job_ids: list[str]) -> int:
        """Of ``job_ids``, those a pause holds that wait with a throttle key's offers give
        them back (P4); how many did."""
        return int(await self.fcall("unoffer", self._common, argv(UnofferArg, *job_ids)))

    async def resume_step(self, scope: Scope, budget: int = LIFT_BUDGET) -> tuple[bool, int]:
        """End ``scope``'s pause and move back up to ``budget`` of its parked jobs: whether
        it was paused here, and how many are left parked (call again while any are)."""
        raw = await self.fcall(
            "resume", self._common, argv(ResumeArg, field=scope_field(scope), budget=budget)
        )
        return bool(int(raw[0])), int(raw[1])

    async def pause_entries(self) -> list[PauseEntry]:
        """Every pause this shard holds, with its reason and its parked jobs."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.keys.pauses)
        pipe.hgetall(self.keys.pause_reasons)
        ends, reasons = await self._call(pipe.execute)
        fields = sorted(_text(f) for f in ends)
        counts: list[int] = []
        if fields:
            pipe = self.client.pipeline(transaction=False)
            for f in fields:
                pipe.zcard(self.keys.parked(f))
            counts = [int(n) for n in await self._call(pipe.execute)]
        why = {_text(f): json.loads(_text(v)) for f, v in reasons.items()}
        by_field = {_text(f): int(_text(v)) for f, v in ends.items()}
        out = []
        for f, parked in zip(fields, counts, strict=True):
            w = why.get(f, {})
            out.append(
                PauseEntry(
                    field_scope(f),
                    by_field[f],
                    str(w.get("reason", "")),
                    str(w.get("by", "")),
                    int(w.get("at", 0)),
                    parked,
                )
            )
        return out

    async def tenant_seen(self, tenant: str, lanes: dict[str, tuple[str, ...]]) -> bool:
        """Whether this shard holds anything of ``tenant``: a setting, work waiting in a
        class of ``lanes`` (lane -> its classes), a deferral, a hold, a finish tag (it
        had work lately), its signals, or a running job."""
        k, pipe = self.keys, self.client.pipeline(transaction=False)
        for settings in (k.weights, k.tlimits, k.tenant_rates, k.tenant_classes):
            pipe.hexists(settings, tenant)
        names = [k.signals(tenant)]
        for lane, classes in lanes.items():
            for cls in classes:
                names += [k.tenant_queue(lane, cls, tenant), k.class_key(lane, cls, f"dq:{tenant}")]
                pipe.sismember(k.class_key(lane, cls, "held"), tenant)
                pipe.hexists(k.class_key(lane, cls, "vt"), f"f:{tenant}")
        pipe.exists(*names)
        if any(bool(x) for x in await self._call(pipe.execute)):
            return True
        running = await self._call(self.client.zrange, k.leases, 0, -1)
        if not running:
            return False
        pipe = self.client.pipeline(transaction=False)
        for job_id in running:
            pipe.hmget(k.job(_text(job_id)), "st", "tenant")
        # a record leaves its tenant out when it is the default one (RECORD_DEFAULTS)
        return any(
            _text(t or RECORD_DEFAULTS["tenant"]) == tenant
            for st, t in await self._call(pipe.execute)
            if st is not None
        )
