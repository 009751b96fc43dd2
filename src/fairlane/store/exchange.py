"""The worker's calls: settling and fetching in one round trip, leases, waiting for work.

Every call is one script and one round trip (``lua/dispatch.lua``, ``lua/lease.lua``):
``exchange`` settles a batch of outcomes and fetches the next jobs, ``renew`` extends
held leases and learns which were lost or are to be cancelled, ``sweep`` reclaims the
expired ones, ``beat`` says the worker is alive and takes back the jobs of workers gone
silent (a worker sends it from a thread, by its blocking twin in ``store/beats.py``),
``leave`` deregisters a stopping worker. Outcomes and fetched jobs travel
as one msgpack buffer each (``fairlane.store.wire``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec

from fairlane.store.argv import (
    AckArg,
    BeatArg,
    ExchangeArg,
    LeaveArg,
    RenewArg,
    SweepArg,
    argv,
)
from fairlane.store.base import StoreBase
from fairlane.store.wire import (
    UNPACK_JOB,
    UNPACK_JOBS,
    UNPACK_RAWS,
    Fetched,
    FetchedJob,
    Outcome,
    as_text,
    decode_rows,
    exchange_args,
    leave_args,
    parse_fetched,
)

__all__ = ["BEAT", "WorkerCalls", "beat_args", "beat_reply"]

_PACK: Final = msgspec.msgpack.Encoder()
#: the library function of a beat, sent by the async call here and its blocking twin
BEAT: Final = "beat"


def beat_args(worker: str, dead_ms: int, limit: int, seed: int) -> list[Any]:
    """The arguments of a beat (``workers.beat`` in ``lua/worker.lua``)."""
    return argv(BeatArg, worker=worker, dead_ms=dead_ms, limit=limit, seed=seed)


def beat_reply(reply: Any) -> tuple[list[str], list[str], list[str]]:
    """A beat's reply: (ids scheduled for retry, ids dead-lettered, dead workers)."""
    retried, dead, gone = reply
    return (
        [as_text(x) for x in retried],
        [as_text(x) for x in dead],
        [as_text(x) for x in gone],
    )


class WorkerCalls(StoreBase):
    """What a worker asks of the store."""

    async def exchange(  # noqa: PLR0917 - mirrors the script's arguments
        self,
        worker: str,
        lanes: Sequence[str],
        want: int,
        lease_ms: int,
        outcomes: Sequence[Outcome] = (),
        promote_limit: int = 1000,
        idle_ms: int = 0,
        slots: int | None = None,
    ) -> Fetched:
        """Settle ``outcomes`` and fetch up to ``want`` slots of work, in one round trip.

        Jobs handed to the worker's inbox come first (even past ``want``). With
        ``idle_ms`` the worker, if given nothing, is registered idle for that long,
        so that enqueues hand their jobs straight to it (see ``wait_for_work``).
        ``slots`` is the worker's size, counted in its lanes' capacity from its first
        exchange until it leaves or goes stale (default: ``want``).
        """
        size = want if slots is None else slots
        blob = exchange_args(
            outcomes,
            worker=worker,
            want=want,
            lease_ms=lease_ms,
            promote_limit=promote_limit,
            lanes=lanes,
            idle_ms=idle_ms,
            slots=size,
        )
        reply = await self.fcall("exchange", self._lane_keys(lanes), argv(ExchangeArg, packed=blob))
        return parse_fetched(reply)

    async def leave(self, worker: str, lease_ms: int, lanes: Sequence[str]) -> list[FetchedJob]:
        """Deregister a stopping worker; returns jobs handed to it that it must hand back."""
        blob = leave_args(worker=worker, lease_ms=lease_ms, lanes=lanes)
        reply = await self.fcall("leave", self._lane_keys(lanes), argv(LeaveArg, packed=blob))
        try:
            return UNPACK_JOBS.decode(reply)
        except msgspec.ValidationError:
            # a row it cannot read is not handed back: its lease expires and it is reclaimed
            return decode_rows(UNPACK_RAWS.decode(reply))[0]

    async def ack(
        self, lanes: Sequence[str], outcomes: Sequence[Outcome], worker: str | None = None
    ) -> list[int]:
        """Settle ``outcomes``; ``worker``, the worker that ran them, keeps its set of
        leased ids exact (a worker's own acks always name it)."""
        args = argv(AckArg, outcomes=_PACK.encode(outcomes), worker=worker)
        return [int(c) for c in await self.fcall("ack", self._lane_keys(lanes), args)]

    async def renew(
        self, worker: str, lease_ms: int, held: Sequence[tuple[str, str]]
    ) -> tuple[list[str], list[str]]:
        """Extend held leases; returns (ids whose lease is lost, ids asked to cancel)."""
        pairs = [part for pair in held for part in pair]
        args = argv(RenewArg, *pairs, worker=worker, lease_ms=lease_ms)
        lost, cancel = await self.fcall("renew", self._common, args)
        return [as_text(x) for x in lost], [as_text(x) for x in cancel]

    async def sweep(
        self, limit: int, seed: int, stale_worker_ms: int
    ) -> tuple[list[str], list[str]]:
        """Reclaim expired leases; returns (ids scheduled for retry, ids dead-lettered)."""
        retried, dead = await self.fcall(
            "sweep",
            self._common,
            argv(SweepArg, limit=limit, seed=seed, stale_worker_ms=stale_worker_ms),
        )
        return [as_text(x) for x in retried], [as_text(x) for x in dead]

    async def beat(
        self, worker: str, dead_ms: int, limit: int, seed: int
    ) -> tuple[list[str], list[str], list[str]]:
        """The worker's beat; reclaims up to ``limit`` jobs of workers that beat and then
        fell silent for ``dead_ms``. Returns (ids scheduled for retry, ids dead-lettered,
        the dead workers it looked at). A worker beats with the blocking twin of this
        call, from a thread (``store/beats.py``)."""
        reply = await self.fcall(BEAT, self._common, beat_args(worker, dead_ms, limit, seed))
        return beat_reply(reply)

    async def wait_for_work(
        self, lanes: Sequence[str], timeout: float, worker: str | None = None
    ) -> FetchedJob | bool:
        """Block until work arrives or ``timeout`` s pass.

        Returns the job an enqueue handed to ``worker``'s inbox (already leased to it),
        True when a lane was woken (fetch to see what is there), False on timeout.
        """
        wake_keys = [self.keys.lane(lane).wake for lane in lanes]
        if worker is not None:
            wake_keys.insert(0, self.keys.inbox(worker))
        # BLPOP takes fractional timeouts; 0 would block forever.
        block = max(timeout, 0.001)
        reply = await self.blocking_call(block, self.blocking.blpop, wake_keys, timeout=block)
        if reply is None:
            return False
        key, value = reply
        if worker is not None and as_text(key) == wake_keys[0]:
            try:
                return UNPACK_JOB.decode(value)
            except msgspec.DecodeError:
                # not a row a hand-off wrote: a wake-up, and its job (if any) is
                # reclaimed with its lease and its record checked again
                return True
        return True
