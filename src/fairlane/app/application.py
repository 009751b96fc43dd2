"""``App``: the object users create, register tasks on, and connect with.

An app is a name (its keys live under ``{fl:<name>}``) and what it declared (its
``Registry``: tasks, workflows, cron entries, lanes, pricing; ``app/declaring.py``),
and -- inside ``async with app`` -- its shards' stores (``ShardedStores``), a result
listener that wakes producers waiting on results (``app/results.py``), the admin
operations (``app/admin.py``) and the worker it runs (``app/worker.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from fairlane.app import admin
from fairlane.app.declaring import Declaring
from fairlane.app.drain import DrainReport, Moment, Progress, drain_filter, run_drain
from fairlane.app.job import Job
from fairlane.app.pauses import Pauses
from fairlane.app.results import ResultListener
from fairlane.app.task import Task
from fairlane.app.tenants import Tenants
from fairlane.app.worker import Worker
from fairlane.app.workflows import SignalResult, send_signal
from fairlane.config.lanes import LaneClasses
from fairlane.config.pools import FairlaneConfig, check_pools_used
from fairlane.config.settings import DurabilitySettings, Settings, load_settings
from fairlane.devserver import ensure_dev_server
from fairlane.metrics.config import MetricsConfig
from fairlane.payloads import PayloadStore
from fairlane.registry import Registry
from fairlane.runtime.pressure import PressureConfig, Sensor
from fairlane.store.api import Store, redact_url
from fairlane.store.connection import cluster_url, sentinel_url
from fairlane.store.drain import CHUNK_BUDGET_US
from fairlane.store.keys import namespace
from fairlane.store.shards import ShardedStores, ShardMap

__all__ = ["App"]

log = logging.getLogger("fairlane")


def _server_url(
    url: str | None,
    cluster_nodes: Sequence[str] | None,
    sentinels: Sequence[str] | None,
    service_name: str | None,
) -> str | None:
    options = {"redis_url": url, "cluster_nodes": cluster_nodes, "sentinels": sentinels}
    given = [name for name, value in options.items() if value]
    if len(given) > 1:
        raise ValueError(f"give one of redis_url, cluster_nodes and sentinels, not {given}")
    if (service_name is None) != (not sentinels):
        raise ValueError("sentinels and service_name go together")
    if cluster_nodes:
        return cluster_url(cluster_nodes)
    if sentinels and service_name:
        return sentinel_url(sentinels, service_name)
    return url


class App(Declaring):
    """A Fairlane application: tasks, cron entries, and a connection to the server."""

    def __init__(
        self,
        name: str,
        *,
        redis_url: str | None = None,
        settings: Settings | None = None,
        project_dir: Path | str | None = None,
        lanes: Mapping[str, LaneClasses] | None = None,
        config: FairlaneConfig | Path | str | None = None,
        charge: Literal["jobs", "cost"] = "cost",
        cluster_nodes: Sequence[str] | None = None,
        sentinels: Sequence[str] | None = None,
        service_name: str | None = None,
        payloads: PayloadStore | str | None = None,
        durability: DurabilitySettings | None = None,
        shards: int | None = None,
    ) -> None:
        namespace(name)  # validates the name
        self.name = name
        settings = settings or load_settings(project_dir=project_dir)
        # every process of an app must use the same count (default: the setting)
        shard_map = ShardMap(settings.shards if shards is None else shards)
        durability = durability or settings.durability
        #: ``cluster_nodes`` ("host:port" of any nodes of a Redis Cluster) and
        #: ``sentinels`` with ``service_name`` are spelt as the URLs that say the same,
        #: so workers started with that URL reach the same deployment
        self.redis_url = _server_url(redis_url, cluster_nodes, sentinels, service_name)
        super().__init__(
            Registry(
                name,
                settings,
                shards=shard_map,
                durability=durability,
                lanes=lanes,
                config=config,
                charge=charge,
                payloads=payloads,
            )
        )
        self._sharded = ShardedStores(shard_map, repr(self))
        #: pause and resume dispatch of a tenant, fairness key, task or lane
        self.pauses = Pauses(self._sharded, self.registry)
        self.tenants = Tenants(self._sharded, self.pauses)
        self._results = ResultListener(self._sharded, name)
        # the server URL in use once connected (``redis_url`` is the one asked for)
        self.url: str | None = None

    def __repr__(self) -> str:
        return f"App({self.name!r})"

    # -- the shards' stores ----------------------------------------------------------

    @property
    def sharded(self) -> ShardedStores:
        """The stores of the app's scheduling shards, and which holds what."""
        return self._sharded

    @property
    def store(self) -> Store:
        """The home shard's store: the app's own records, and every tenant's when the
        app has one shard (``store_for_tenant`` and ``store_for_job`` find the rest)."""
        return self._sharded.store

    @property
    def stores(self) -> list[Store]:
        """One store per scheduling shard, in shard order (they share connections)."""
        return self._sharded.stores

    def shard_of(self, tenant: str) -> int:
        return self._sharded.shard_of(tenant)

    def store_for_tenant(self, tenant: str) -> Store:
        """The store of the shard holding ``tenant``'s queues, jobs and limits."""
        return self._sharded.store_for_tenant(tenant)

    def store_for_job(self, job_id: str) -> Store:
        """The store of the shard a job's id names."""
        return self._sharded.store_for_job(job_id)

    # -- connecting ------------------------------------------------------------------

    def resolve_url(self) -> str:
        """The server URL: the argument, else FAIRLANE_REDIS_URL / settings, else the dev server."""
        if self.redis_url:
            return self.redis_url
        if self.settings.redis_url:
            return self.settings.redis_url
        return ensure_dev_server(self.settings.server.state_dir, self.settings.server.binary)

    async def connect(self, *, declare: bool = True) -> None:
        """Open the app's connections and, unless ``declare`` is False, record its tasks
        and lanes on every shard (``StoreLayoutError`` if a shard holds data of another
        store layout). Without, nothing is read or written: enough to count or delete
        the app's keys whatever wrote them."""
        if self._sharded.connected:
            return
        self.check_lanes()
        # a pool that names no lane of the app would bound nothing, without a word
        check_pools_used(self.registry.config, self.registry.lanes_used())
        url = await asyncio.to_thread(self.resolve_url)
        timeouts = self.settings.connection
        payloads = self.payloads
        await self._sharded.open(
            url,
            self.name,
            socket_timeout=timeouts.timeout,
            socket_connect_timeout=timeouts.connect_timeout,
            max_connections=timeouts.max_connections,
            prepare_jobs=None if payloads is None else payloads.offload_jobs,
            audit_entries=self.settings.audit_entries,
            memory_mark=self.settings.queues.memory_high_water,
        )
        try:
            if declare:
                await self.registry.declare(self._sharded.stores)
        except BaseException:
            await self._sharded.aclose()
            raise
        self.url = url
        log.info("fairlane app %s using server %s", self.name, redact_url(url))

    async def declare_tasks(self) -> None:
        """Record each task's retention on the server, where sweeps read it."""
        await self.registry.declare_tasks(self.stores)

    def check_lanes(self) -> None:
        """Raise ``ValueError`` if a task's service class is not in its lane's table."""
        self.registry.check_lanes()

    async def declare_lanes(self) -> None:
        """Record each declared lane's class table, and its admission config, on the
        server, where dispatch and admission read them."""
        await self.registry.declare_lanes(self.stores)

    async def aclose(self) -> None:
        await self._results.aclose()
        await self._sharded.aclose()

    async def __aenter__(self) -> App:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- producing -------------------------------------------------------------------

    async def enqueue(self, task_name: str, /, *args: Any, **kwargs: Any) -> Job[Any]:
        """Enqueue a task by its name (``UnknownTask`` if the app has none of that name)."""
        return await self.get_task(task_name).enqueue(*args, **kwargs)

    async def wait_finished(self, job_id: str) -> tuple[str, bytes, bytes]:
        """Wait (no polling) until a job is finished; returns (status, result, error)."""
        return await self._results.wait_finished(job_id)

    async def signal(
        self, run_id: str, name: str, payload: Any = None, *, signal_id: str | None = None
    ) -> SignalResult:
        """Send signal ``name`` to a workflow run: ``delivered`` (kept until a wait of
        that name takes it; a signal sent before the run waits is not lost),
        ``duplicate`` (``signal_id`` was delivered already) or ``finished`` (the run has
        ended; nothing is kept). ``RunNotFound`` if there is no such run."""
        return await send_signal(self, run_id, name, payload, signal_id=signal_id)

    # -- operating -------------------------------------------------------------------

    async def run_worker(
        self,
        *,
        lanes: Sequence[str] | None = None,
        concurrency: int | None = None,
        burst: bool = False,
        handle_signals: bool = False,
        health_port: int | None = None,
        metrics_port: int | None = None,
        metrics: MetricsConfig | None = None,
        pressure: PressureConfig | None = None,
        sensors: Sequence[Sensor] | None = None,
    ) -> None:
        """Run a worker in this process until it is stopped (or, with ``burst``, idle).

        ``metrics_port`` serves Prometheus ``/metrics`` and ``/autoscale`` on that port
        (0: a free one); ``metrics`` sets how tenants are labelled (``fairlane.metrics``).
        ``pressure`` sets how the worker holds back under resource pressure; ``sensors``
        replaces the built-in sensors (``fairlane.runtime.pressure``) with your own.
        """
        owns_connection = not self._sharded.connected
        # the worker records the app's tasks and lanes itself, retrying through a restart,
        # before it fetches: recorded here as well, they cost its start-up a round trip each
        await self.connect(declare=False)
        settings = self.settings.worker
        try:
            worker = Worker(
                self,
                lanes=list(lanes or settings.lanes),
                concurrency=concurrency or settings.concurrency,
                burst=burst,
                health_port=health_port if health_port is not None else settings.health_port,
                metrics_port=metrics_port,
                metrics=(metrics or MetricsConfig()).with_horizon(self.settings.autoscale_horizon),
                pressure=pressure,
                sensors=sensors,
            )
            await worker.run(handle_signals=handle_signals)
        finally:
            if owns_connection:
                await self.aclose()

    async def dead_letters(self, limit: int = 100) -> list[tuple[str, float]]:
        """Dead-lettered job ids with the time (epoch seconds) they died, oldest first
        (the oldest ``limit`` of every shard, merged)."""
        return await admin.dead_letters(self._sharded, limit)

    async def redrive(self, job_ids: Sequence[str] = (), *, limit: int = 100) -> list[str]:
        """Send dead-lettered jobs back to their queues with a fresh attempt budget:
        those named, else up to ``limit`` of them, the home shard's first. A job in a
        restricted class its tenant is not entitled to stays where it is."""
        return await admin.redrive(self._sharded, job_ids, limit)

    async def stats(self) -> dict[str, int]:
        """The store's counters, summed over the shards."""
        return await admin.stats(self._sharded)

    async def drain(
        self,
        *,
        tenant: str | None = None,
        fairness_key: str | None = None,
        task: str | Task[Any, Any] | None = None,
        lane: str | None = None,
        service_class: str | None = None,
        state: str | Sequence[str] | None = None,
        enqueued_after: Moment | None = None,
        enqueued_before: Moment | None = None,
        dry_run: bool = False,
        progress: Progress | None = None,
        actor: str = "api",
        pause: float = 0.0,
        chunk_us: int = CHUNK_BUDGET_US,
    ) -> DrainReport:
        """Cancel every waiting job (queued, throttled, deferred, scheduled; ``state``
        picks among them) that each given filter matches, however many, in bounded
        chunks that let every other client's calls through between them; running jobs
        are left alone (``fairlane.app.drain``). ``enqueued_after`` /
        ``enqueued_before``: seconds since the epoch or timezone-aware datetimes (at or
        after, before). Jobs enqueued after the drain began are not taken. ``dry_run``
        counts only; ``progress`` is told the counts after each chunk. A chunk is one call
        that stops once it has used ``chunk_us`` of the server's CPU time (or looked at
        1000 jobs); ``pause`` (s) is waited between chunks: smaller chunks and longer
        pauses give the other clients more of the server and the drain less. A drain cut
        off half-way is finished by running it again.
        Recorded in the audit trail as done by ``actor`` (not a dry run). ``UnknownTask``
        / ``ValueError`` for a task, lane, class or state the app does not have, nothing
        changed; a filter that matches nothing drains 0 jobs."""
        flt = drain_filter(
            self.registry,
            tenant=tenant,
            fairness_key=fairness_key,
            task=task.name if isinstance(task, Task) else task,
            lane=lane,
            service_class=service_class,
            state=state,
            enqueued_after=enqueued_after,
            enqueued_before=enqueued_before,
        )
        return await run_drain(
            self._sharded,
            self.registry,
            flt,
            dry_run=dry_run,
            progress=progress,
            actor=actor,
            audit=self.store.key_records.audit,
            budget_us=chunk_us,
            pause=pause,
        )

    async def purge(self) -> int:
        """Delete every key of this app, in every shard, and the large payloads its
        records kept in the payload store. Returns the number of keys removed."""
        return await admin.purge(self._sharded, self.payloads)
