"""What operators' pauses hold back, as the metrics and ``/autoscale`` read it: the pauses
in force by kind, the jobs they parked, and the waiting slots they keep from dispatch.

A pause holds work in two ways (``fairlane.policy.pauses``): a task's or a fairness
key's jobs are parked (out of their queues and out of the class's waiting slots
``d:<class>``, into ``parked:<field>``), while a lane's or class's pause and a tenant's
leave the jobs where they were, in their queues and in ``d:<class>``. The backlog an
autoscaler reads must not count those: :func:`paused_work` says, per lane and class, how
many of the waiting slots a pause holds -- every one of a paused lane or class, and a
paused tenant's queue in each class (in jobs: a job wider than one slot counts as one
here, so a paused tenant's wide jobs are under-counted, never another tenant's work
hidden) -- each shard's held slots at most its ``d:<class>``.

Read in at most two round trips: each shard's pause table (``HGETALL pause``), and,
only when some pause is there, the parked sets' sizes, the paused tenants' queue
lengths, and the server's clock of each shard whose table holds a pause with an end (to
tell a pause in force from one that ended and waits to be lifted). A task's or lane's
pause, held in every shard, counts once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fairlane.policy.pauses import Scope, ScopeKind, in_force
from fairlane.store.fields import field_int, field_text
from fairlane.store.keys import AppKeys
from fairlane.store.pausing import field_scope
from fairlane.store.reads import Cmd, Plan, cmd, server_time
from fairlane.store.views.lanes import LaneState

__all__ = ["PausedWork", "paused_work"]

#: the kinds of pause, in the order the metrics list them
KINDS: tuple[str, ...] = tuple(kind.value for kind in ScopeKind)


@dataclass(frozen=True, slots=True)
class PausedWork:
    """The pauses in force by kind (``ScopeKind``), the jobs pauses parked, and per
    (lane, class) the waiting slots a pause holds back."""

    scopes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    parked: int = 0
    held: dict[tuple[str, str], int] = field(default_factory=dict)


def _scopes(raw: Mapping[object, object]) -> dict[str, tuple[Scope, int]]:
    """A pause table: field -> its scope and its end (0: none; 1: ended, being lifted);
    a field that names no scope (damaged) is left out."""
    out = {}
    for f, until in raw.items():
        name = field_text(f)
        try:
            out[name] = (field_scope(name), field_int(until, 0))
        except (KeyError, IndexError, ValueError):
            continue
    return out


@dataclass(slots=True)
class _Shard:
    """One shard's pause table, and the reads it asks for with their replies' places."""

    keys: AppKeys
    lanes: Mapping[str, LaneState]
    table: dict[str, tuple[Scope, int]]
    reads: list[Cmd] = field(default_factory=list)
    clock: int | None = None  # the place of its TIME read, if it needs one
    parked: list[int] = field(default_factory=list)
    queues: list[tuple[str, str, str, int]] = field(default_factory=list)  # lane, class, tenant

    def plan(self, at: int) -> None:
        def place() -> int:
            return at + len(self.reads)

        if any(until > 1 for _, until in self.table.values()):
            self.clock = place()
            self.reads.append(server_time(self.keys.pauses))
        for f, (scope, _) in self.table.items():
            if scope.kind in (ScopeKind.TASK, ScopeKind.KEY):
                self.parked.append(place())
                self.reads.append(cmd("zcard", self.keys.parked(f)))
            elif scope.kind == ScopeKind.TENANT:
                for lane, state in self.lanes.items():
                    for cls in state.waiting:
                        self.queues.append((lane, cls, scope.tenant, place()))
                        self.reads.append(
                            cmd("zcard", self.keys.tenant_queue(lane, cls, scope.tenant))
                        )

    def in_force(self, replies: list[object]) -> dict[str, Scope]:
        now = None if self.clock is None else field_int(replies[self.clock], 0)
        return {
            f: scope
            for f, (scope, until) in self.table.items()
            if (until == 0 if now is None else in_force(until, now))
        }

    def held(self, replies: list[object], live: Sequence[Scope]) -> dict[tuple[str, str], int]:
        """Per (lane, class), the waiting slots the pauses in force hold back here."""
        tenants = {s.tenant for s in live if s.kind == ScopeKind.TENANT}
        classes = {(s.lane, s.cls) for s in live if s.kind == ScopeKind.LANE}
        queued: dict[tuple[str, str], int] = {}
        for lane, cls, tenant, at in self.queues:
            if tenant in tenants:
                queued[(lane, cls)] = queued.get((lane, cls), 0) + field_int(replies[at], 0)
        out: dict[tuple[str, str], int] = {}
        for lane, state in self.lanes.items():
            for cls, waiting in state.waiting.items():
                whole = (lane, "") in classes or (lane, cls) in classes
                n = waiting if whole else min(waiting, queued.get((lane, cls), 0))
                if n > 0:
                    out[(lane, cls)] = n
        return out


def paused_work(
    keys: Sequence[AppKeys], lanes: Sequence[Mapping[str, LaneState]]
) -> Plan[PausedWork]:
    """What the pauses of every shard hold; ``lanes`` are each shard's lane states (their
    waiting slots per class), in shard order."""
    tables = yield [cmd("hgetall", k.pauses) for k in keys]
    shards = [_Shard(k, ls, _scopes(t)) for k, ls, t in zip(keys, lanes, tables, strict=True)]
    if not any(s.table for s in shards):
        return PausedWork()
    batch: list[Cmd] = []
    for shard in shards:
        shard.plan(len(batch))
        batch += shard.reads
    replies = yield batch
    kinds: dict[str, int] = dict.fromkeys(KINDS, 0)
    seen: set[str] = set()
    held: dict[tuple[str, str], int] = {}
    parked = 0
    for shard in shards:
        live = shard.in_force(replies)
        for f in live.keys() - seen:
            kinds[live[f].kind.value] += 1
        seen |= live.keys()
        parked += sum(field_int(replies[i], 0) for i in shard.parked)
        for where, n in shard.held(replies, list(live.values())).items():
            held[where] = held.get(where, 0) + n
    return PausedWork(kinds, parked, held)
