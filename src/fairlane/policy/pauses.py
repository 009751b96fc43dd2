"""An operator's pauses: which waiting work dispatch holds back, and how it comes back.

A pause names a *scope*: a tenant, one fairness key of a tenant, a task, or a lane (one
class of it, or all of its classes). While it is in force nothing of its scope starts;
running work goes on (unless the operator asks for it to be cancelled); waiting work
keeps its place. A tenant may also be *quarantined*: its new submissions are refused.
A pause and a quarantine may each end at a given instant.

The rules, which ``store/lua/pausetable.lua`` and ``store/lua/pauses.lua`` carry out in
the dispatch step and ``fairlane.policy.reference`` composes into the model:

P1. A lane or class pause: the class has no head while it holds (``class_held``); its
    tenants keep their tags and queues untouched.
P2. A tenant pause: when the tenant comes to the head of a class's fair set, it leaves
    the set as a tenant whose queue emptied does (its start tag kept as its finish tag,
    its weight out of the class's waiting weight) and is noted as *held* in that class.
    Its queue stays as it was. On resume every held class of the tenant activates it
    again by the ordinary activation rule, ``max(F, V - run / active)``
    (``fairlane.policy.fairqueue``): V went on while it was held, so it comes back level
    with the others' finished work -- its credit bounded by the work in flight, as for
    any tenant that was idle, and never behind by the time it was paused.
P3. A task or fairness-key pause: a job of the scope that comes to the head of its
    class is *parked*: out of its tenant's queue into the scope's parked set at its own
    order score, not charged to its tenant (as a job that parks on a throttle key), its
    waiting slots out of the class's demand. On resume parked jobs go back into their
    queues at their own places, as a job a throttle key woke does.
P4. Offers: a job a throttle key wakes while its scope is paused gives its offers back
    at once (they go to the next waiters) and waits in its queue holding none, to pass
    its keys again once it may run. A paused scope holds no capacity of any key.
P5. Precedence: a lane or class pause decides before a tenant's, a tenant's before a
    key's or a task's. A pause ends when resumed or at its expiry, whichever is first;
    an expired pause holds nothing (``in_force``).

Nothing here reads a clock: ``now`` is the server's, passed in.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

import msgspec

__all__ = [
    "DEFAULT_REFUSAL_RETRY_S",
    "LIFT_BUDGET",
    "PauseTable",
    "Scope",
    "ScopeKind",
    "in_force",
    "refusal_retry_after",
    "scope_text",
]

#: Retry-After (s) of a refused submission when the quarantine names no end
DEFAULT_REFUSAL_RETRY_S: Final = 60.0
#: parked jobs one server call puts back (a resume's, or a dispatch lifting a pause that
#: ended): each is a few commands, so that no call holds the server for milliseconds
LIFT_BUDGET: Final = 50


class ScopeKind(StrEnum):
    TENANT = "tenant"
    KEY = "key"  # one fairness key of a tenant
    TASK = "task"
    LANE = "lane"  # a lane, or one class of it
    REFUSE = "refuse"  # a tenant's quarantine: its submissions are refused


class Scope(msgspec.Struct, frozen=True):
    """What a pause names. ``cls`` only for a lane ('' = every class); ``key`` only for a
    fairness key (with its ``tenant``)."""

    kind: ScopeKind
    tenant: str = ""
    key: str = ""
    task: str = ""
    lane: str = ""
    cls: str = ""

    def __post_init__(self) -> None:
        needs = {
            ScopeKind.TENANT: self.tenant,
            ScopeKind.REFUSE: self.tenant,
            ScopeKind.KEY: self.tenant and self.key,
            ScopeKind.TASK: self.task,
            ScopeKind.LANE: self.lane,
        }[self.kind]
        if not needs:
            raise ValueError(f"a {self.kind.value} pause needs its name(s): {self}")


def scope_text(scope: Scope) -> str:
    """A scope as an operator reads it: ``tenant acme``, ``lane gpu/batch``, ..."""
    match scope.kind:
        case ScopeKind.TENANT:
            return f"tenant {scope.tenant}"
        case ScopeKind.REFUSE:
            return f"submissions of tenant {scope.tenant}"
        case ScopeKind.KEY:
            return f"fairness key {scope.key} of tenant {scope.tenant}"
        case ScopeKind.TASK:
            return f"task {scope.task}"
        case _:
            return f"lane {scope.lane}" + (f"/{scope.cls}" if scope.cls else "")


def in_force(until_ms: int, now_ms: int) -> bool:
    """Whether a pause that ends at ``until_ms`` (0: never) holds at ``now_ms``."""
    return until_ms == 0 or now_ms < until_ms


def refusal_retry_after(until_ms: int, now_ms: int) -> float:
    """Retry-After (s) of a submission a quarantine refused: up to its end, or the
    default when it names none."""
    if until_ms == 0:
        return DEFAULT_REFUSAL_RETRY_S
    return max(1.0, (until_ms - now_ms) / 1000)


class PauseTable(msgspec.Struct):
    """The pauses in force, by scope, each with its end (0: none)."""

    entries: dict[Scope, int] = msgspec.field(default_factory=dict)

    def pause(self, scope: Scope, until_ms: int = 0) -> None:
        self.entries[scope] = until_ms

    def resume(self, scope: Scope) -> bool:
        return self.entries.pop(scope, None) is not None

    def _holds(self, scope: Scope, now_ms: int) -> bool:
        until = self.entries.get(scope)
        return until is not None and in_force(until, now_ms)

    def class_held(self, lane: str, cls: str, now_ms: int) -> bool:
        """P1: the lane, or this class of it, is paused."""
        return self._holds(Scope(ScopeKind.LANE, lane=lane), now_ms) or self._holds(
            Scope(ScopeKind.LANE, lane=lane, cls=cls), now_ms
        )

    def tenant_held(self, tenant: str, now_ms: int) -> bool:
        """P2: the tenant is paused."""
        return self._holds(Scope(ScopeKind.TENANT, tenant=tenant), now_ms)

    def job_scope(self, task: str, tenant: str, key: str, now_ms: int) -> Scope | None:
        """P3: the paused scope a job of ``task``, ``tenant`` and fairness ``key`` ('' none)
        parks under: its key's before its task's; None when neither is paused."""
        if key:
            by_key = Scope(ScopeKind.KEY, tenant=tenant, key=key)
            if self._holds(by_key, now_ms):
                return by_key
        by_task = Scope(ScopeKind.TASK, task=task)
        return by_task if self._holds(by_task, now_ms) else None

    def blocks(self, lane: str, cls: str, *, task: str, tenant: str, key: str, now_ms: int) -> bool:
        """Whether anything holds a job of these names back (P4 asks it of a woken job)."""
        return (
            self.class_held(lane, cls, now_ms)
            or self.tenant_held(tenant, now_ms)
            or self.job_scope(task, tenant, key, now_ms) is not None
        )

    def refuses(self, tenant: str, now_ms: int) -> int | None:
        """The end (0: none) of the quarantine refusing ``tenant``'s submissions, or None."""
        until = self.entries.get(Scope(ScopeKind.REFUSE, tenant=tenant))
        return until if until is not None and in_force(until, now_ms) else None
