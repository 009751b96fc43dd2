"""The fetch decision: how many slots a worker's shard loop asks for, and when it waits.

A worker has ``concurrency`` slots. Running jobs hold ``used`` of them (a job holds its
width, one unless it asked for more) and exchanges still under way on other shards
have ``reserved`` more; what is left is ``free = concurrency - used - reserved``. The
loops of one worker's shards take turns at these slots, and each turn is decided here.

**Room.** Without resource pressure the next call may fill every free slot. Under
pressure the backpressure policy (``policy/backpressure.py``) gives a share of the
slots; the room is then ``allowance(decision, concurrency, used + reserved)``: never
more than is free, and none at all while the decision holds the worker back. So
``room <= free`` always, and ``room <= 0`` means that this turn asks for nothing.

**Budget.** A busy worker asks for ``min(room, batch, max(1, concurrency // 2))``
slots per call: leasing at most half its slots per call keeps one batch running while
the server prepares the next, so the worker and the server work side by side, and
``batch`` bounds one reply. The server fills the slots asked for with jobs of any
width up to what is left of them, so a capped ask can never lease a job wider than the
cap: the first call, and the first after each idle wait or empty burst check, ask for
the whole room (``widen``), and a job of any width that fits the free slots is leased.

**Waiting.** With ``room <= 0`` the turn waits: for a slot to be freed when none is
(``free <= 0``; below zero after a job handed over while idle was wider than what was
free), or, when slots are free but pressure allows none, it holds -- leasing nothing,
re-checking at the pressure interval, while running jobs go on and settle.

**Between shards.** A worker serving several shards holds each turn's ask to that
shard's part of the slots while other shards wait for theirs (``within_share``, the part
from ``policy/shardshare.py``); a shard at its part waits for a slot to be freed.

**After a reply.** Jobs in the reply: ask again at once, capped. An empty reply while
the shard has nothing running or unsettled in burst mode means the shard may be done,
but only a wide ask proves it: an empty capped reply says nothing of wider jobs, so
that ask is made wide again first. Otherwise the loop waits on the shard's wake lists
for at most ``idle_block`` seconds, less when a scheduled job falls due sooner. Every
path but "jobs came" makes the next ask wide.

Everything here is pure: no clock, no I/O; the shard loop passes what it knows.
"""

from __future__ import annotations

import enum

import msgspec

from fairlane.policy.backpressure import Decision, allowance

__all__ = [
    "FetchPlan",
    "Next",
    "SlotCount",
    "Wait",
    "accept_handed",
    "after_reply",
    "budget",
    "idle_registration_ms",
    "idle_timeout",
    "plan_fetch",
    "room",
    "within_share",
]


class SlotCount(msgspec.Struct, frozen=True):
    """A worker's slots at one moment: how many, held by running jobs, reserved by calls."""

    concurrency: int
    used: int = 0
    reserved: int = 0

    @property
    def taken(self) -> int:
        return self.used + self.reserved

    @property
    def free(self) -> int:
        """Slots neither held nor reserved; below zero after a wide hand-off."""
        return self.concurrency - self.taken


class Wait(enum.Enum):
    """What a turn that asks for nothing waits for."""

    NONE = "none"  # the turn asks the server for ``want`` slots
    FULL = "full"  # no slot is free: until a running job frees one
    PRESSURE = "pressure"  # slots are free but pressure allows none: hold a pressure interval
    # slots are free but this shard holds its part while other shards wait for theirs
    # (policy/shardshare.py): until a slot is freed
    SHARE = "share"


class FetchPlan(msgspec.Struct, frozen=True):
    """One turn's decision: ask for ``want`` slots, or wait for ``wait``."""

    want: int
    wait: Wait
    free: int
    room: int

    @property
    def widest(self) -> int:
        """The widest job the reply can hold: the server leases none wider than the ask."""
        return self.want

    @property
    def capped(self) -> bool:
        """Whether the ask is below the room (an empty reply then says nothing of wider jobs)."""
        return self.want < self.room


class Next(enum.Enum):
    """What the shard loop does after an exchange answered."""

    FETCH = "fetch"  # jobs came: ask again at once, capped
    WIDEN = "widen"  # burst, an empty capped reply: ask again for the whole room
    DRAINED = "drained"  # burst, an empty wide reply: see whether every shard is empty
    IDLE = "idle"  # wait on the shard's wake lists

    @property
    def widen(self) -> bool:
        """Whether the next ask is for the whole room."""
        return self is not Next.FETCH


def room(slots: SlotCount, decision: Decision | None) -> int:
    """Slots the next call may fill: the free ones, fewer (or none) under pressure."""
    if decision is None:
        return slots.free
    return allowance(decision, slots.concurrency, slots.taken)


def budget(room: int, *, batch: int, concurrency: int) -> int:
    """How many slots a busy worker asks for in one call (see the module's docstring)."""
    return min(room, batch, max(1, concurrency // 2))


def plan_fetch(
    slots: SlotCount, decision: Decision | None, *, batch: int, widen: bool
) -> FetchPlan:
    """The turn's ask given the slots and the pressure decision (None: no pressure)."""
    allowed = room(slots, decision)
    free = slots.free
    if allowed <= 0:
        wait = Wait.PRESSURE if free > 0 else Wait.FULL
        return FetchPlan(0, wait, free, allowed)
    want = allowed if widen else budget(allowed, batch=batch, concurrency=slots.concurrency)
    return FetchPlan(want, Wait.NONE, free, allowed)


def within_share(plan: FetchPlan, limit: int | None) -> FetchPlan:
    """``plan`` held to the shard's ``limit`` (``policy.shardshare.cap``; None: none). The
    room shrinks with the ask, so that an empty reply to it says what a wide one would."""
    if limit is None or plan.wait is not Wait.NONE or limit >= plan.room:
        return plan
    if limit <= 0:
        return FetchPlan(0, Wait.SHARE, plan.free, 0)
    return FetchPlan(min(plan.want, limit), Wait.NONE, plan.free, limit)


def after_reply(plan: FetchPlan, *, got_jobs: bool, burst: bool, shard_busy: bool) -> Next:
    """The step after an answered exchange; ``shard_busy``: the shard has jobs running on
    this worker or outcomes still to settle."""
    if got_jobs:
        return Next.FETCH
    if burst and not shard_busy:
        return Next.WIDEN if plan.capped else Next.DRAINED
    return Next.IDLE


def idle_timeout(idle_block: float, next_due_ms: int | None, *, stopping: bool) -> float | None:
    """How long an idle loop waits for work (None: it does not wait): ``idle_block``, or
    until the next scheduled job is due if that is sooner."""
    timeout = idle_block if next_due_ms is None else min(idle_block, next_due_ms / 1000)
    if timeout <= 0 or stopping:
        return None
    return timeout


def idle_registration_ms(idle_block: float, *, burst: bool, stopping: bool) -> int:
    """How long the server keeps an idle worker registered to be handed jobs (0: not at
    all); it outlives the longest block, so a registered worker is always listening."""
    if burst or stopping:
        return 0
    return round((idle_block + 1.0) * 1000)


def accept_handed(*, holding: bool, free: int) -> bool:
    """Whether a job an enqueue handed to an idle loop starts, or goes back unstarted: it
    goes back under a hold, or when another shard's loop filled the slots meanwhile."""
    return not holding and free > 0
