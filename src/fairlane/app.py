"""``App``: the object users create, register tasks on, and connect with.

An app is a name (its keys live under ``{fl:<name>}``), a registry of tasks, cron
entries and lanes' class tables, and -- inside ``async with app`` -- a connection to
the server and a listener that wakes producers waiting on results.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, ParamSpec, Protocol, TypeVar, overload

from cronsim import CronSim, CronSimError
from redis.asyncio.client import PubSub
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fairlane.admission import Pricing
from fairlane.config.lanes import LaneClasses, LaneTables, check_limits, load_lanes
from fairlane.config.pools import FairlaneConfig, load_config
from fairlane.config.settings import DurabilitySettings, Settings, load_settings
from fairlane.errors import JobNotFound, UnknownTask
from fairlane.metrics import MetricsConfig
from fairlane.payloads import PayloadStore, open_store
from fairlane.payloads.offload import Payloads
from fairlane.payloads.sweep import remove_all as remove_all_payloads
from fairlane.policy.backoff import Backoff
from fairlane.policy.classes import ClassTable
from fairlane.policy.retention import Retention
from fairlane.policy.shards import check_shard_count, shard_of_tenant
from fairlane.runtime.outage import Outage
from fairlane.runtime.pressure import PressureConfig, Sensor
from fairlane.runtime.worker import Worker
from fairlane.store.api import Store, redact_url, unlink_matching
from fairlane.store.connection import cluster_url, sentinel_url
from fairlane.store.keys import job_shard, namespace
from fairlane.store.server import ensure_dev_server
from fairlane.store.wire import StoreUnavailable
from fairlane.task import Executor, Job, Task, TaskOptions
from fairlane.tenants import Tenants
from fairlane.workflows import (
    SignalResult,
    Workflow,
    WorkflowFunction,
    WorkflowOptions,
    send_signal,
)

__all__ = ["App", "CronEntry", "TaskDecorator"]

log = logging.getLogger("fairlane")
#: how long a waiter trusts the result notice before it reads the job record again
_RESULT_RECHECK_SECONDS = 10.0
P = ParamSpec("P")
R = TypeVar("R")

RESERVED_PARAMETERS = frozenset(
    {
        "tenant",
        "delay",
        "at",
        "deadline",
        "idempotency_key",
        "priority",
        "service_class",
        "slots",
        "limits",
        "trace",
        "durability",
    }
)
_DEFAULTS: dict[str, Any] = {
    "attempts": 3,
    "backoff": Backoff(base=1.0, cap=60.0, jitter="full"),
    "timeout": 300.0,
    "retention": Retention(),
    "executor": "async",
    "retry_on": (Exception,),
    "service_class": "standard",
    "slots": 1,
    "limits": None,
}
_UNSET: Any = object()


class TaskDecorator(Protocol):
    """Turns a function into a task; an async function's task returns what it awaits."""

    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]], /) -> Task[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...


class CronEntry:
    """A task enqueued once per tick of a cron schedule, across any number of workers."""

    def __init__(self, schedule: str, task: Task[[], Any]) -> None:
        try:
            CronSim(schedule, _utc_now())
        except CronSimError as exc:
            raise ValueError(f"bad cron schedule {schedule!r}: {exc}") from None
        self.schedule = schedule
        self.task = task


def _utc_now() -> datetime:
    return datetime.now(UTC)


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


def _payloads(given: PayloadStore | str | None, settings: Settings) -> Payloads | None:
    store = given if given is not None else settings.payloads.url
    if store is None:
        return None
    return Payloads(open_store(store) if isinstance(store, str) else store, settings.payloads)


class App:
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
        self.settings = settings or load_settings(project_dir=project_dir)
        #: scheduling shards, each a whole scheduler under its own hash tag; tenants
        #: are spread over them by a stable hash (``fairlane.policy.shards``). Every
        #: process of an app must use the same count (default: the ``shards`` setting)
        self.shards = check_shard_count(self.settings.shards if shards is None else shards)
        #: what every enqueue waits for replicas or AOF fsyncs to confirm, unless the
        #: call says otherwise (default: the ``durability`` settings, which ask nothing)
        self.durability = durability or self.settings.durability
        #: ``cluster_nodes`` ("host:port" of any nodes of a Redis Cluster) and
        #: ``sentinels`` with ``service_name`` are spelt as the URLs that say the same,
        #: so workers started with that URL reach the same deployment
        self.redis_url = _server_url(redis_url, cluster_nodes, sentinels, service_name)
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.crons: dict[str, CronEntry] = {}
        self.lane_tables = LaneTables()
        if self.settings.lanes_file is not None:
            path = self.settings.lanes_file
            for lane, table in load_lanes(path).items():
                self.lane_tables.declare(lane, table, source=f"lanes_file {path}")
        for lane, classes in (lanes or {}).items():
            self.lane_tables.declare(lane, classes, source="App(lanes=...)")
        if config is not None and not isinstance(config, FairlaneConfig):
            config = load_config(config)
        # a config's [retry] gives tasks their default attempt budget and backoff
        self._task_defaults = dict(_DEFAULTS)
        if config is not None:
            self._task_defaults["attempts"] = config.retry.max_attempts
            self._task_defaults["backoff"] = config.retry.backoff
        if charge not in ("jobs", "cost"):
            raise ValueError(f'charge must be "jobs" or "cost", got {charge!r}')
        #: how tenants are charged for fair shares: one unit per job, or what jobs cost
        self.charge = charge
        #: pools (lanes with admission control), retry and estimation settings
        self.config = config or FairlaneConfig()
        for lane, pool in self.config.pools.items():
            self.lane_tables.declare(lane, pool.table, source="App(config=...)")
        self.tenants = Tenants(self)
        # how declared estimates become reservations, and rejections' Retry-After
        self.pricing = Pricing(
            self.config.coefficients,
            self.config.estimation,
            self.config.retry.retry_after_policy,
        )
        self._stores: list[Store] = []
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._pubsub: PubSub | None = None
        self._listener: asyncio.Task[None] | None = None
        self._listener_lock = asyncio.Lock()
        # the server URL in use once connected (``redis_url`` is the one asked for)
        self.url: str | None = None
        #: large arguments and results go to this payload store (``payloads=``: a store
        #: or its URL, else the ``payloads.url`` setting); None keeps them in the server
        self.payloads = _payloads(payloads, self.settings)

    def __repr__(self) -> str:
        return f"App({self.name!r})"

    # -- declaring -------------------------------------------------------------------

    def lane(self, name: str, *, classes: LaneClasses) -> ClassTable:
        """Declare a lane's service classes (a lane not declared uses ``DEFAULT_CLASSES``)."""
        table = self.lane_tables.declare(name, classes, source="app.lane()")
        try:
            for task in self.tasks.values():
                if task.options.lane == name:
                    self._check_class(task.options)
        except ValueError:
            self.lane_tables.forget(name)  # a refused declaration leaves nothing behind
            raise
        return table

    @property
    def lanes(self) -> dict[str, ClassTable]:
        """The lanes declared on this app, with their class tables."""
        return dict(self.lane_tables.items())

    def lane_classes(self, lane: str) -> ClassTable:
        """The class table jobs of ``lane`` are dispatched by: as declared, else the default."""
        return self.lane_tables.table(lane)

    def _check_class(self, options: TaskOptions) -> None:
        try:
            self.lane_tables.check_class(options.lane, options.service_class)
        except ValueError as exc:
            raise ValueError(f"task {options.name}: {exc}") from None

    @overload
    def task(self, fn: Callable[P, Awaitable[R]], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        lane: str | None = None,
        attempts: int = ...,
        backoff: Backoff = ...,
        timeout: float | None = ...,
        retention: Retention = ...,
        executor: Executor = ...,
        retry_on: Sequence[type[BaseException]] = ...,
        service_class: str = ...,
        slots: int = ...,
        limits: Mapping[str, int] | None = ...,
        tenant_slots: int | None = ...,
    ) -> TaskDecorator: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        lane: str | None = None,
        attempts: Any = _UNSET,
        backoff: Any = _UNSET,
        timeout: Any = _UNSET,
        retention: Any = _UNSET,
        executor: Any = _UNSET,
        retry_on: Any = _UNSET,
        service_class: Any = _UNSET,
        slots: Any = _UNSET,
        limits: Any = _UNSET,
        tenant_slots: int | None = None,
    ) -> Any:
        """Register a function as a task. Every option left out is marked as a default.

        ``service_class``, ``slots`` and ``limits`` are the defaults of the task's jobs;
        each enqueue may change them. ``tenant_slots`` caps how many of one tenant's
        jobs of the task's lane run at once.
        """
        given: dict[str, Any] = {
            "attempts": attempts,
            "backoff": backoff,
            "timeout": timeout,
            "retention": retention,
            "executor": executor,
            "retry_on": retry_on,
            "service_class": service_class,
            "slots": slots,
            "limits": limits,
        }

        def register(func: Callable[..., Any]) -> Task[Any, Any]:
            options = self._options(func, name, lane, given, tenant_slots)
            return self._register(func, options)

        return register(fn) if fn is not None else register

    def _options(
        self,
        func: Callable[..., Any],
        name: str | None,
        lane: str | None,
        given: dict[str, Any],
        tenant_slots: int | None,
    ) -> TaskOptions:
        """A task's options: those given, the app's defaults for the rest."""
        defaults = {k for k, v in given.items() if v is _UNSET}
        values = {k: (self._task_defaults[k] if v is _UNSET else v) for k, v in given.items()}
        if lane is None:
            defaults.add("lane")
        task_name = name or f"{func.__module__}.{func.__qualname__}"
        try:
            task_limits = check_limits(values["limits"])
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"task {task_name}: {exc}") from None
        options = TaskOptions(
            name=task_name,
            lane=lane or self.settings.default_lane,
            attempts=values["attempts"],
            backoff=values["backoff"],
            timeout=values["timeout"],
            retention=values["retention"],
            executor=values["executor"],
            retry_on=tuple(values["retry_on"]),
            service_class=values["service_class"],
            slots=values["slots"],
            limits=task_limits,
            tenant_slots=tenant_slots,
            defaults=frozenset(defaults),
        )
        # a lane declared later is checked by `lane()`; an undeclared one at connect
        if self.lane_tables.is_declared(options.lane):
            self._check_class(options)
        return options

    def workflow(
        self,
        *,
        name: str | None = None,
        lane: str | None = None,
        slice_seconds: float = 2.0,
        slice_steps: int = 20,
        max_children: int = 10,
        tenant_slots: int | None = None,
        attempts: int = _UNSET,
        backoff: Backoff = _UNSET,
        timeout: float | None = _UNSET,
        retention: Retention = _UNSET,
        retry_on: Sequence[type[BaseException]] = _UNSET,
        service_class: str = _UNSET,
        limits: Mapping[str, int] | None = _UNSET,
    ) -> Callable[[WorkflowFunction[P, R]], Workflow[P, R]]:
        """Register a durable workflow: ``async def fn(ctx: Context, ...)``.

        Each lease of a run is a slice: it replays the run's checkpoints, then goes on
        until the run finishes or waits, or until ``slice_steps`` new steps or
        ``slice_seconds`` are spent; then the run gives its slot back and re-enters
        fair dispatch as its tenant's work. ``attempts`` is the run's budget for
        failed or reclaimed slices (a slice that yields or waits does not count);
        ``timeout`` bounds one slice. ``tenant_slots`` caps the runs one tenant has
        running in the lane at once; ``max_children`` caps one run's running children.
        """
        shape = WorkflowOptions(slice_seconds, slice_steps, max_children)
        given: dict[str, Any] = {
            "attempts": attempts,
            "backoff": backoff,
            "timeout": timeout,
            "retention": retention,
            "executor": "async",
            "retry_on": retry_on,
            "service_class": service_class,
            "slots": 1,
            "limits": limits,
        }

        def register(func: WorkflowFunction[P, R]) -> Workflow[P, R]:
            params = list(inspect.signature(func).parameters.values())
            if not params or params[0].kind not in (
                inspect.Parameter.POSITIONAL_ONLY,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
            ):
                raise ValueError(
                    f"workflow {func.__qualname__} must take the run's Context as its first "
                    "positional parameter"
                )
            options = self._options(func, name, lane, given, tenant_slots)
            flow: Workflow[P, R] = Workflow(self, func, options, shape)
            self._register(func, options, flow)
            return flow

        return register

    async def signal(
        self, run_id: str, name: str, payload: Any = None, *, signal_id: str | None = None
    ) -> SignalResult:
        """Send signal ``name`` to a workflow run: ``delivered`` (kept until a wait of
        that name takes it; a signal sent before the run waits is not lost),
        ``duplicate`` (``signal_id`` was delivered already) or ``finished`` (the run has
        ended; nothing is kept). ``RunNotFound`` if there is no such run."""
        return await send_signal(self, run_id, name, payload, signal_id=signal_id)

    def _register(
        self, func: Callable[..., Any], options: TaskOptions, made: Task[Any, Any] | None = None
    ) -> Task[Any, Any]:
        clash = RESERVED_PARAMETERS & set(inspect.signature(func).parameters)
        if clash:
            raise ValueError(
                f"task {options.name}: parameter names {sorted(clash)} are reserved for enqueue "
                "options; rename them"
            )
        is_async = inspect.iscoroutinefunction(func)
        if options.executor == "async" and not is_async:
            raise ValueError(
                f"task {options.name} is a sync function: declare executor='thread' or "
                "executor='process' so it cannot block the event loop"
            )
        if options.executor != "async" and is_async:
            raise ValueError(f"task {options.name} is async: executor must be 'async'")
        if options.name in self.tasks:
            raise ValueError(f"a task named {options.name!r} is already registered")
        task: Task[Any, Any] = made or Task(self, func, options)
        self.tasks[options.name] = task
        return task

    def cron(
        self,
        schedule: str,
        *,
        name: str | None = None,
        lane: str | None = None,
        attempts: int = 1,
        timeout: float | None = _UNSET,
        executor: Executor = _UNSET,
        service_class: str = _UNSET,
        slots: int = _UNSET,
        limits: Mapping[str, int] | None = _UNSET,
    ) -> Callable[[Callable[[], Any]], Task[[], Any]]:
        """Run a no-argument function once per tick of ``schedule`` (5-field cron, UTC)."""

        def register(func: Callable[[], Any]) -> Task[[], Any]:
            try:  # each tick enqueues a call without arguments
                inspect.signature(func).bind()
            except TypeError:
                raise ValueError(
                    f"cron task {func.__qualname__} must be callable without arguments"
                ) from None
            task = self.task(
                name=name or f"cron:{func.__module__}.{func.__qualname__}",
                lane=lane,
                attempts=attempts,
                timeout=timeout,
                executor=executor,
                service_class=service_class,
                slots=slots,
                limits=limits,
                # a tick's job is kept (and so deduplicated) for a day
                retention=Retention(completed="1d", failed="7d"),
            )(func)
            try:
                self.crons[task.name] = CronEntry(schedule, task)
            except ValueError:
                del self.tasks[task.name]  # a refused cron leaves no task behind
                raise
            return task

        return register

    async def enqueue(self, task_name: str, /, *args: Any, **kwargs: Any) -> Job[Any]:
        """Enqueue a task by its name (``UnknownTask`` if the app has none of that name)."""
        return await self.get_task(task_name).enqueue(*args, **kwargs)

    def get_task(self, name: str) -> Task[Any, Any]:
        try:
            return self.tasks[name]
        except KeyError:
            raise UnknownTask(f"no task named {name!r} in app {self.name!r}") from None

    # -- connecting ------------------------------------------------------------------

    def resolve_url(self) -> str:
        """The server URL: the argument, else FAIRLANE_REDIS_URL / settings, else the dev server."""
        if self.redis_url:
            return self.redis_url
        if self.settings.redis_url:
            return self.settings.redis_url
        return ensure_dev_server(self.settings.server.state_dir, self.settings.server.binary)

    @property
    def store(self) -> Store:
        """The home shard's store: the app's own records, and every tenant's when the
        app has one shard (``store_for_tenant`` and ``store_for_job`` find the rest)."""
        return self.stores[0]

    @property
    def stores(self) -> list[Store]:
        """One store per scheduling shard, in shard order (they share connections)."""
        if not self._stores:
            raise RuntimeError(f"{self!r} is not connected: use `async with app:`")
        return self._stores

    def shard_of(self, tenant: str) -> int:
        return shard_of_tenant(tenant, self.shards)

    def store_for_tenant(self, tenant: str) -> Store:
        """The store of the shard holding ``tenant``'s queues, jobs and limits."""
        return self.stores[shard_of_tenant(tenant, self.shards)]

    def store_for_job(self, job_id: str) -> Store:
        """The store of the shard a job's id names."""
        return self.stores[job_shard(job_id, self.shards)]

    async def connect(self) -> None:
        if self._stores:
            return
        self.check_lanes()
        url = await asyncio.to_thread(self.resolve_url)
        timeouts = self.settings.connection
        store = Store.from_url(
            url,
            self.name,
            socket_timeout=timeouts.timeout,
            socket_connect_timeout=timeouts.connect_timeout,
            shards=self.shards,
        )
        if self.payloads is not None:
            store.prepare_jobs = self.payloads.offload_jobs
        try:
            # the library goes to every primary of a cluster, so one load serves all shards
            await store.connect()
            self._stores = [
                store,
                *(store.shard_store(i, self.shards) for i in range(1, self.shards)),
            ]
            await self.declare_tasks()
            await self.declare_lanes()
        except BaseException:
            self._stores = []
            await store.aclose()
            raise
        self.url = url
        log.info("fairlane app %s using server %s", self.name, redact_url(url))

    async def declare_tasks(self) -> None:
        """Record each task's retention on the server, where sweeps read it."""
        for task in self.tasks.values():
            keep = task.options.retention
            for store in self.stores:
                await store.declare_task(task.name, keep.completed.encode(), keep.failed.encode())

    def check_lanes(self) -> None:
        """Raise ``ValueError`` if a task's service class is not in its lane's table."""
        for task in self.tasks.values():
            self._check_class(task.options)

    async def declare_lanes(self) -> None:
        """Record each declared lane's class table, and its admission config, on the
        server, where dispatch and admission read them."""
        used = {task.options.lane for task in self.tasks.values()}
        used.add(self.settings.default_lane)
        for lane in sorted(used | {lane for lane, _ in self.lane_tables.items()}):
            table = self.lane_classes(lane)
            pool = self.config.pools.get(lane)
            for store in self.stores:
                await store.declare_lane(lane, table, self.charge)
                await store.declare_admission(
                    lane, table, pool.admission if pool else None, self.config.estimation
                )

    async def aclose(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None
        if self._pubsub is not None:
            await self._pubsub.aclose()  # type: ignore[no-untyped-call]
            self._pubsub = None
        if self._stores:
            await self._stores[0].aclose()  # the other shards' stores share its clients
            self._stores = []

    async def __aenter__(self) -> App:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- results ---------------------------------------------------------------------

    async def _ensure_listener(self) -> None:
        if self._pubsub is not None:
            return
        # many waiters arrive at once (a gather of results): one of them subscribes, the
        # rest wait for it, rather than each opening a subscription of its own
        async with self._listener_lock:
            if self._listener_started():
                return
            pubsub = self.store.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(*self._done_channels())
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                await pubsub.aclose()  # type: ignore[no-untyped-call]
                raise StoreUnavailable(f"the Redis server is unreachable: {exc}") from exc
            self._pubsub = pubsub
            self._listener = asyncio.create_task(self._listen(pubsub), name="fairlane-results")

    async def _listen(self, pubsub: PubSub) -> None:
        outage = Outage(f"app {self.name}: result listener", log)
        while True:
            try:
                message = await pubsub.get_message(timeout=30.0)
            except (RedisConnectionError, RedisTimeoutError, OSError, StoreUnavailable) as exc:
                await asyncio.sleep(outage.failed(exc))
                # a new subscription, confirmed, rather than trusting the old object to
                # subscribe again on its next read: until it is, notices are lost
                pubsub = self._pubsub = await self._subscribe_again(pubsub, outage)
                outage.recovered()
                # what finished while we were not subscribed is only in the records
                self._wake_all()
                continue
            if message is None:
                continue
            job_id = message["data"].decode()
            for fut in self._waiters.pop(job_id, ()):
                if not fut.done():
                    fut.set_result(None)

    async def _subscribe_again(self, old: PubSub, outage: Outage) -> PubSub:
        with contextlib.suppress(Exception):
            await old.aclose()  # type: ignore[no-untyped-call]
        while True:
            pubsub = self.store.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(*self._done_channels())
                return pubsub
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
                await asyncio.sleep(outage.failed(exc))

    def _listener_started(self) -> bool:
        # a method, not an inline test: the attribute changes while a waiter awaits the lock
        return self._pubsub is not None

    def _done_channels(self) -> list[str]:
        return [store.keys.done_channel for store in self.stores]

    def _wake_all(self) -> None:
        for futures in self._waiters.values():
            for fut in futures:
                if not fut.done():
                    fut.set_result(None)
        self._waiters.clear()

    async def wait_finished(self, job_id: str) -> tuple[str, bytes, bytes]:
        """Wait (no polling) until a job is finished; returns (status, result, error)."""
        while True:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(job_id, []).append(fut)
            try:
                try:
                    await self._ensure_listener()
                    reply = await self.store_for_job(job_id).watch(job_id)
                except StoreUnavailable:
                    # ride out an outage: the caller's timeout bounds the wait
                    await asyncio.sleep(random.uniform(0.25, 0.75))
                    continue
                status = reply[0].decode()
                if status == "missing":
                    raise JobNotFound(f"no record of job {job_id}")
                if len(reply) == 3:
                    return status, reply[1], reply[2]
                # the notice normally wakes it; the bound makes a lost notice cost a
                # re-read of the record, never the caller's whole timeout
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(fut, _RESULT_RECHECK_SECONDS)
            finally:
                waiting = self._waiters.get(job_id)
                if waiting and fut in waiting:
                    waiting.remove(fut)
                    if not waiting:
                        del self._waiters[job_id]

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
        owns_connection = not self._stores
        await self.connect()
        try:
            worker = Worker(
                self,
                lanes=list(lanes or self.settings.worker.lanes),
                concurrency=concurrency or self.settings.worker.concurrency,
                burst=burst,
                health_port=health_port
                if health_port is not None
                else self.settings.worker.health_port,
                metrics_port=metrics_port,
                metrics=metrics,
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
        found: list[tuple[str, float]] = []
        for store in self.stores:
            found.extend(await store.dead_letters(limit))
        found.sort(key=lambda item: (item[1], item[0]))
        return [(job_id, ms / 1000) for job_id, ms in found[:limit]]

    async def redrive(self, job_ids: Sequence[str] = (), *, limit: int = 100) -> list[str]:
        """Send dead-lettered jobs back to their queues with a fresh attempt budget:
        those named, else up to ``limit`` of them, the home shard's first."""
        done: list[str] = []
        if job_ids:
            by_shard: dict[int, list[str]] = {}
            for job_id in job_ids:
                by_shard.setdefault(job_shard(job_id, self.shards), []).append(job_id)
            for shard, ids in by_shard.items():
                done.extend(await self.stores[shard].redrive(ids, limit))
            return done
        for store in self.stores:
            if len(done) >= limit:
                break
            done.extend(await store.redrive((), limit - len(done)))
        return done

    async def stats(self) -> dict[str, int]:
        """The store's counters, summed over the shards."""
        total: dict[str, int] = {}
        for store in self.stores:
            for name, value in (await store.stats()).items():
                total[name] = total.get(name, 0) + value
        return total

    async def purge(self) -> int:
        """Delete every key of this app, in every shard, and the large payloads its
        records kept in the payload store. Returns the number of keys removed."""
        removed = 0
        for store in self.stores:
            if self.payloads is not None:
                await remove_all_payloads(store, self.payloads)
            removed += await unlink_matching(store.client, store.keys.match_all())
        return removed
