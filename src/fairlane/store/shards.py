"""An app's stores, one per scheduling shard, and submitting jobs to one of them.

An app's scheduling state is split over ``count`` shards (``fairlane.policy.shards``),
each a whole scheduler under its own hash tag. ``ShardMap`` is the one object that
holds the count and says which shard holds what: a tenant's queues, jobs and limits
live in the shard its name hashes to, and a job's id names its shard. The registry's
job factory and ``ShardedStores`` share it, so the two never disagree.
``ShardedStores`` holds the shards' stores, which share one set of connections,
opened by ``open`` and closed by ``aclose``.

``submit`` stores jobs with the durability an app asks for (WAIT / WAITAOF after the
enqueue script, ``store/durability.py``, where ``NotAcknowledged`` is what a caller
raises when that confirmation fell short).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import msgspec

from fairlane.policy.admission.memory import DEFAULT_MEMORY_MARK
from fairlane.policy.shards import check_shard_count, shard_of_tenant
from fairlane.store.api import Store
from fairlane.store.apikeys import KeyGuard
from fairlane.store.durability import Acknowledgement, submit_acknowledged
from fairlane.store.keys import job_shard, shard_job_id
from fairlane.store.memory import MemoryGauge
from fairlane.store.wire import NewJob, Submitted

if TYPE_CHECKING:
    from fairlane.config.settings import DurabilitySettings

__all__ = ["PrepareJobs", "ShardMap", "ShardedStores", "submit"]

PrepareJobs = Callable[[Store, Sequence[NewJob]], Awaitable[Sequence[NewJob]]]


async def submit(
    store: Store,
    lane: str,
    jobs: Sequence[NewJob],
    durability: DurabilitySettings,
    guard: KeyGuard | None = None,
) -> tuple[list[Submitted], Acknowledgement | None]:
    """``store.submit``, then, if ``durability`` asks for anything, the wait for it;
    the acknowledgement is None when nothing was asked. A ``guard`` (a gateway caller's
    key, checked in the same step) takes no durability wait."""
    if durability.requested:
        if guard is not None:
            raise ValueError("a key-guarded submit waits for no durability")
        return await submit_acknowledged(store, lane, jobs, durability)
    return await store.submit(lane, jobs, guard), None


class ShardMap(msgspec.Struct, frozen=True):
    """An app's count of scheduling shards, and the shard of a tenant or a job id."""

    count: int

    def __post_init__(self) -> None:
        check_shard_count(self.count)

    def of_tenant(self, tenant: str) -> int:
        """The shard of ``tenant``'s queues, jobs and limits (a hash of its name)."""
        return shard_of_tenant(tenant, self.count)

    def of_job(self, job_id: str) -> int:
        """The shard a job's id names."""
        return job_shard(job_id, self.count)

    def id_prefix(self, shard: int) -> str:
        """What a new job's id starts with in ``shard`` (its raw id follows): a batch
        puts it on each of its ids without a call per job."""
        return shard_job_id("", shard, self.count)


class ShardedStores:
    """The stores of an app's scheduling shards, in shard order."""

    def __init__(self, shards: ShardMap, owner: str) -> None:
        self.map = shards
        # named in the error of a lookup before ``open``: the object users connect
        self._owner = owner
        self._stores: list[Store] = []

    @property
    def count(self) -> int:
        return self.map.count

    @property
    def connected(self) -> bool:
        return bool(self._stores)

    @property
    def stores(self) -> list[Store]:
        """One store per scheduling shard, in shard order (they share connections)."""
        if not self._stores:
            raise RuntimeError(f"{self._owner} is not connected: use `async with app:`")
        return self._stores

    @property
    def store(self) -> Store:
        """The home shard's store: the app's own records, and every tenant's when the
        app has one shard."""
        return self.stores[0]

    def shard_of(self, tenant: str) -> int:
        return self.map.of_tenant(tenant)

    def store_for_tenant(self, tenant: str) -> Store:
        """The store of the shard holding ``tenant``'s queues, jobs and limits."""
        return self.stores[self.map.of_tenant(tenant)]

    def store_for_job(self, job_id: str) -> Store:
        """The store of the shard a job's id names."""
        return self.stores[self.map.of_job(job_id)]

    def by_shard(self, job_ids: Sequence[str]) -> dict[int, list[str]]:
        """``job_ids`` grouped by the shard each names, in the order given."""
        grouped: dict[int, list[str]] = {}
        of_job = self.map.of_job
        for job_id in job_ids:
            grouped.setdefault(of_job(job_id), []).append(job_id)
        return grouped

    async def open(
        self,
        url: str,
        app: str,
        *,
        socket_timeout: float,
        socket_connect_timeout: float,
        max_connections: int = 64,
        prepare_jobs: PrepareJobs | None = None,
        audit_entries: int | None = None,
        memory_mark: float | None = DEFAULT_MEMORY_MARK,
    ) -> None:
        """Connect to ``url`` and load the function library; the shards' stores share
        the connections. Submissions are refused ``StoreFull`` above ``memory_mark`` of
        the server's maxmemory (None: never). A failure leaves nothing open."""
        store = Store.from_url(
            url,
            app,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            max_connections=max_connections,
            shards=self.count,
        )
        store.prepare_jobs = prepare_jobs
        store.memory = MemoryGauge(memory_mark)
        if audit_entries is not None:
            store.audit_entries = audit_entries
        try:
            # the library goes to every primary of a cluster, so one load serves all shards
            await store.connect()
        except BaseException:
            await store.aclose()
            raise
        self._stores = [store, *(store.shard_store(i, self.count) for i in range(1, self.count))]

    async def aclose(self) -> None:
        if self._stores:
            await self._stores[0].aclose()  # the other shards' stores share its clients
            self._stores = []
