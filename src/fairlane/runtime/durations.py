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
#: distinct (shard, task, tenant, class) a batch may gather between two sends: past it,
#: only those already in the batch are added to
_MAX_KEYS: Final = 4096
#: fields per call: a batch of many tenants is sent in calls the server runs quickly
_PER_CALL: Final = 1000
# an entry's places: attempts, their ms, their slot-ms, charges noted, their units
_N, _MS, _SLOT_MS, _CHARGES, _UNITS = range(5)

_Key = tuple[int, str, str, str]  # shard, task, tenant, class


class DurationLearner(WorkerHooks):
    """Notes each attempt's length and sends the batch every ``interval`` seconds.

    An attempt costs one dictionary lookup and a few additions: the fields the store
    keeps (per tenant and class, per class, per task and tenant, per task) are made
    from the batch when it is sent, not per attempt."""

    def __init__(
        self, stores: ShardedStores, lane_of: Callable[[str], str], interval: float = 2.0
    ) -> None:
        self._stores = stores
        self._lane_of = lane_of
        self.interval = interval
        self._batch: dict[_Key, list[float]] = {}

    def _entry(self, job: FetchedJob) -> list[float] | None:
        shard = self._stores.map.of_job(job.id) if self._stores.count > 1 else 0
        key = (shard, job.task, job.tenant, job.service_class)
        entry = self._batch.get(key)
        if entry is None and len(self._batch) < _MAX_KEYS:
            entry = self._batch[key] = [0, 0.0, 0.0, 0, 0.0]
        return entry

    def finished(self, job: FetchedJob, outcome: Outcome | None, seconds: float) -> None:
        if outcome is None or outcome.kind not in _LEARNED:
            return
        entry = self._entry(job)
        if entry is not None:
            ms = seconds * 1000
            entry[_N] += 1
            entry[_MS] += ms
            entry[_SLOT_MS] += ms * max(1, job.slots)

    def used(self, job: FetchedJob, usage: JobContext, units: float) -> None:
        # the units its tenant is charged for it, in a lane that charges by cost
        entry = self._entry(job)
        if entry is not None:
            entry[_CHARGES] += 1
            entry[_UNITS] += units

    def _fields(self, batch: dict[_Key, list[float]]) -> dict[int, dict[str, list[float]]]:
        """The batch as the store's fields, per shard: field -> [observations, their sum]."""
        out: dict[int, dict[str, list[float]]] = {}
        for (shard, task, tenant, cls), e in batch.items():
            fields = out.setdefault(shard, {})
            lane = self._lane_of(task)
            if e[_N]:
                _add(fields, tenant_field(lane, cls, tenant), e[_N], e[_SLOT_MS])
                _add(fields, class_field(lane, cls), e[_N], e[_SLOT_MS])
                _add(fields, task_field(task, tenant), e[_N], e[_MS])
                _add(fields, task_field(task), e[_N], e[_MS])
            if e[_CHARGES]:
                _add(fields, charge_field(lane, cls, tenant), e[_CHARGES], e[_UNITS])
        return out

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
        batch, self._batch = self._batch, {}
        written = 0
        for shard, fields in self._fields(batch).items():
            entries = [(f, int(n), total) for f, (n, total) in fields.items()]
            store = self._stores.stores[shard]
            try:
                for i in range(0, len(entries), _PER_CALL):
                    written += await store.learn_durations(entries[i : i + _PER_CALL])
            except (StoreError, StoreFull) as exc:
                log.debug("learned lengths not sent to shard %d: %s", shard, exc)
        return written


def _add(fields: dict[str, list[float]], field: str, n: float, total: float) -> None:
    entry = fields.setdefault(field, [0, 0.0])
    entry[0] += n
    entry[1] += total
