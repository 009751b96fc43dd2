"""Reading and acting on jobs by id: records, events, cancel, dead letters, counters.

Records and events are decoded by ``fairlane.store.records`` (``read_job`` for a typed
record, whole or a projection); ``job_record`` and ``job_fields`` give the hash as
stored, for callers that check the layout itself. Reads that span every shard of an
app are the read models of ``fairlane.store.views``.
"""

from __future__ import annotations

from collections.abc import Sequence

from fairlane.store.argv import CancelArg, RedriveArg, WatchArg, argv
from fairlane.store.base import StoreBase
from fairlane.store.records import (
    Event,
    JobAttr,
    JobRecord,
    decode_event,
    from_hash,
    from_values,
    job_fields,
)
from fairlane.store.removals import Removal, decode_removal
from fairlane.store.views.lanes import LaneState, lane_states
from fairlane.store.views.totals import summed
from fairlane.store.wire import as_text

__all__ = ["JobCalls"]


class JobCalls(StoreBase):
    """One shard's jobs, read and acted on by id."""

    async def read_job(
        self, job_id: str, only: Sequence[JobAttr] | None = None
    ) -> JobRecord | None:
        """The job's record (only the attributes ``only`` when given), None when there
        is no such job."""
        key = self.keys.job(job_id)
        if only is None:
            return from_hash(job_id, await self._call(self.client.hgetall, key))
        values = await self._call(self.client.hmget, key, job_fields(only))
        return from_values(job_id, only, values)

    async def job_fields(self, job_id: str, *fields: str) -> list[bytes | None]:
        """Fields of the job's hash as stored (``JOB_FIELDS``)."""
        return list(await self._call(self.client.hmget, self.keys.job(job_id), list(fields)))

    async def job_record(self, job_id: str) -> dict[str, bytes]:
        """The job's hash as stored, by field name ({} when there is no such job)."""
        raw = await self._call(self.client.hgetall, self.keys.job(job_id))
        return {as_text(k): v for k, v in raw.items()}

    async def job_events(self, job_id: str) -> list[Event]:
        """A job's lifecycle events, oldest first (the last 64 the store kept)."""
        raw = await self._call(self.client.lrange, self.keys.events(job_id), 0, -1)
        return [decode_event(entry) for entry in raw]

    async def records_exist(self, job_ids: Sequence[str]) -> list[bool]:
        """Whether each job still has a record, in one round trip (none asked: none sent)."""
        if not job_ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.exists(self.keys.job(job_id))
        return [bool(n) for n in await self._call(pipe.execute)]

    async def removal(self, job_id: str) -> Removal | None:
        """Why a job has no record, when retention removed it recently (else None)."""
        score = await self._call(self.client.zscore, self.keys.gone, job_id)
        return None if score is None else decode_removal(float(score))

    async def is_dead_letter(self, job_id: str) -> bool:
        return await self._call(self.client.zscore, self.keys.dead, job_id) is not None

    async def cancel(self, job_id: str) -> str:
        return as_text(await self.fcall("cancel", self._common, argv(CancelArg, id=job_id)))

    async def watch(self, job_id: str) -> list[bytes]:
        return list(await self.fcall("watch", self._common, argv(WatchArg, id=job_id)))

    async def redrive(self, ids: Sequence[str] = (), limit: int = 100) -> list[str]:
        reply = await self.fcall("redrive", self._common, argv(RedriveArg, *ids, limit=limit))
        return [as_text(x) for x in reply]

    async def dead_letters(self, limit: int = 100) -> list[tuple[str, float]]:
        raw = await self._call(self.client.zrange, self.keys.dead, 0, limit - 1, withscores=True)
        return [(as_text(member), float(score)) for member, score in raw]

    async def stats(self) -> dict[str, int]:
        """This shard's counters (the stats hash: ``fairlane.store.views.totals``)."""
        return summed([await self._call(self.client.hgetall, self.keys.stats)])

    async def lane_state(self, lane: str) -> LaneState:
        """A lane's capacity and its classes' slots and counters, as this shard caches them."""
        return (await self.read(lane_states([self.keys], [lane])))[lane]
