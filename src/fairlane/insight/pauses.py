"""An operator's pause in ``explain``'s words: which pause holds a waiting job now, and
the sentence that says so.

A job is held by a pause in one of two ways (``fairlane.policy.pauses``): its lane or
class, or its tenant, is paused, and it waits in its queue as it was (no event says
so); or its task or fairness key is paused, and dispatch parked it (a ``paused`` event
naming the scope's field, and the record's ``pz`` while it stays parked). Which holds
it is read from its shard's pause table as it is now (``PauseEntry``), in the
precedence dispatch applies (P5): its lane or class, then its tenant, then its key or
task, the field it is parked under first. A job held by several pauses waits from the
first one's start, each stretch named by the pause that decides it by then.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from fairlane.insight.words import Why
from fairlane.policy.pauses import PauseTable, Scope, ScopeKind, in_force, scope_text
from fairlane.store.pausing import PauseEntry, field_scope
from fairlane.store.records import JobRecord

__all__ = ["CAUSE", "holding", "parked_why", "paused_why", "utc"]

#: the cause of a wait an operator's pause made
CAUSE = "operator"


def utc(ms: int) -> str:
    """A server time as people read it: ``2026-03-01 12:00:05 UTC``."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _scope_of(field: str) -> Scope | None:
    try:
        return field_scope(field)
    except (KeyError, IndexError, ValueError):
        return None  # a damaged field names no scope


def holding(record: JobRecord, entries: Sequence[PauseEntry], now_ms: int) -> list[PauseEntry]:
    """The pauses that hold ``record``'s job back now, the one dispatch decides by first."""
    if not entries:
        return []
    by_scope = {e.scope: e for e in entries}
    table = PauseTable({e.scope: e.until_ms for e in entries})
    lane, cls, tenant = record.lane, record.service_class, record.tenant
    candidates: list[Scope | None] = []
    # a record without the names a scope needs (damaged, or never stored) names none
    if lane and table.class_held(lane, cls, now_ms):
        candidates += [Scope(ScopeKind.LANE, lane=lane), Scope(ScopeKind.LANE, lane=lane, cls=cls)]
    if tenant and table.tenant_held(tenant, now_ms):
        candidates.append(Scope(ScopeKind.TENANT, tenant=tenant))
    if record.paused_under:
        candidates.append(_scope_of(record.paused_under))
    if record.task and tenant:
        candidates.append(table.job_scope(record.task, tenant, record.fairness_key, now_ms))
    found = [by_scope.get(scope) for scope in candidates if scope is not None]
    held = [e for e in found if e is not None and in_force(e.until_ms, now_ms)]
    return list({e.scope: e for e in held}.values())


def paused_why(entry: PauseEntry) -> Why:
    """``paused by an operator at <time>: <reason> (<scope>, by <who>, until <time>)``."""
    told = [scope_text(entry.scope)]
    if entry.by:
        told.append(f"by {entry.by}")
    if entry.until_ms > 1:
        told.append(f"until {utc(entry.until_ms)}")
    reason = entry.reason or "no reason given"
    return Why(
        f"paused by an operator at {utc(entry.at_ms)}: {reason} ({', '.join(told)})",
        CAUSE,
        (scope_text(entry.scope),),
    )


def parked_why(field: str) -> Why:
    """A job dispatch parked under a paused task's or key's field, as its event says
    (what the pause table says of it now is added while it still waits)."""
    scope = _scope_of(field)
    shown = scope_text(scope) if scope is not None else "a scope"
    return Why(f"parked by an operator's pause of {shown}", CAUSE, (shown,))
