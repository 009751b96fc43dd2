"""What a worker's attempts took, folded into the store's learned lengths every few
seconds: the ground a start-time estimate and a deadline check stand on
(``fairlane.policy.startpredict``, ``store/durations.py``).

An attempt's length is noted in memory when it ends (a dictionary update); a loop sends
each shard its batch, one call per interval, so no job's own calls carry anything for
it and a busy worker's cost does not grow with its rate. Only attempts that ran to an
end count (completed, or failed by their own code): one handed back, cancelled or cut
off by a lost lease says nothing of how long the work takes. A batch the store cannot
take (unreachable, full) is dropped: the means are learned again from the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterable
from contextlib import AsyncExitStack
from typing import Any, Final

from fairlane.errors import StoreFull
from fairlane.runtime.hooks import WorkerHooks, WorkerView
from fairlane.runtime.usage import JobContext
from fairlane.store.durations import charge_field, class_field, task_field, tenant_field
from fairlane.store.shards import ShardedStores
from fairlane.store.wire import FetchedJob, Outcome, OutcomeKind, StoreError

__all__ = ["DurationLearner"]

log = logging.getLogger("fairlane.worker")

#: attempts whose length is a measure of the work
_LEARNED: Final = frozenset({OutcomeKind.OK, OutcomeKind.RETRY, OutcomeKind.DEAD})
#: distinct fields a shard's batch may gather between two sends (four per tenant and
#: task): past it, only fields already in the batch are added to
_MAX_FIELDS: Final = 4096


class DurationLearner(WorkerHooks):
    """Notes each attempt's length and sends the batch every ``interval`` seconds."""

    def __init__(
        self, stores: ShardedStores, lane_of: Callable[[str], str], interval: float = 2.0
    ) -> None:
        self._stores = stores
        self._lane_of = lane_of
        self.interval = interval
        # shard -> field -> [attempts, their sum in ms]
        self._batches: dict[int, dict[str, list[float]]] = {}

    def finished(self, job: FetchedJob, outcome: Outcome | None, seconds: float) -> None:
        if outcome is None or outcome.kind not in _LEARNED:
            return
        lane, cls, ms = self._lane_of(job.task), job.service_class, seconds * 1000
        slot_ms = ms * max(1, job.slots)
        batch = self._batch(job)
        _add(batch, tenant_field(lane, cls, job.tenant), slot_ms)
        _add(batch, class_field(lane, cls), slot_ms)
        _add(batch, task_field(job.task, job.tenant), ms)
        _add(batch, task_field(job.task), ms)

    def used(self, job: FetchedJob, usage: JobContext, units: float) -> None:
        # the units its tenant is charged for it, in a lane that charges by cost
        lane = self._lane_of(job.task)
        _add(self._batch(job), charge_field(lane, job.service_class, job.tenant), units)

    def _batch(self, job: FetchedJob) -> dict[str, list[float]]:
        return self._batches.setdefault(self._stores.map.of_job(job.id), {})

    def serving(
        self, worker: WorkerView, stack: AsyncExitStack
    ) -> Iterable[Coroutine[Any, Any, None]]:
        return (self.run(worker.closed),)

    async def run(self, closed: asyncio.Event) -> None:
        """Send every ``interval`` until ``closed``, then once more."""
        while not closed.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closed.wait(), self.interval)
            await self.send()

    async def send(self) -> int:
        """Send what was noted since the last send; returns the fields written."""
        batches, self._batches = self._batches, {}
        written = 0
        for shard, batch in batches.items():
            entries = [(f, int(n), total) for f, (n, total) in batch.items()]
            try:
                written += await self._stores.stores[shard].learn_durations(entries)
            except (StoreError, StoreFull) as exc:
                log.debug("learned lengths not sent to shard %d: %s", shard, exc)
        return written


def _add(batch: dict[str, list[float]], field: str, value: float) -> None:
    entry = batch.get(field)
    if entry is None:
        if len(batch) >= _MAX_FIELDS:
            return
        entry = batch[field] = [0, 0.0]
    entry[0] += 1
    entry[1] += value
