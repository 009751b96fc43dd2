"""``Registry``: everything an app declared, apart from any connection.

An app's declarations are its tasks and workflows (``TaskDefinition``), its cron
entries, its lanes' class tables and admission pools, how its work is priced and
charged, its payload store and its default durability. Declaring checks each one as
it comes, against what was declared before (a task's service class against its lane's
table, a lane's table against the tasks on it), so a refused declaration leaves
nothing behind. The worker reads the registry; ``declare`` records the parts the
server's scripts read (each task's retention, each lane's classes and admission).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from fairlane.config.lanes import LaneClasses, LaneTables, load_lanes
from fairlane.config.pools import FairlaneConfig, load_config
from fairlane.config.settings import DurabilitySettings, Settings
from fairlane.errors import UnknownTask
from fairlane.payloads import PayloadStore, open_store
from fairlane.payloads.offload import Payloads
from fairlane.policy.classes import ClassTable
from fairlane.registry.calls import check_limits, check_rates
from fairlane.registry.definitions import CronEntry, TaskDefinition
from fairlane.registry.jobs import JobFactory
from fairlane.registry.naming import default_name
from fairlane.registry.options import RESERVED_PARAMETERS, TASK_DEFAULTS, TaskOptions
from fairlane.registry.pricing import Pricing
from fairlane.store.api import Store
from fairlane.store.shards import ShardMap

__all__ = ["UNSET", "Registry"]

#: an option the declaration left out: the app's default applies, and is marked as one
UNSET: Any = object()


def _payloads(given: PayloadStore | str | None, settings: Settings) -> Payloads | None:
    store = given if given is not None else settings.payloads.url
    if store is None:
        return None
    return Payloads(open_store(store) if isinstance(store, str) else store, settings.payloads)


class Registry:
    """What one app declared: tasks, workflows, cron entries, lanes, pricing."""

    def __init__(
        self,
        name: str,
        settings: Settings,
        *,
        shards: ShardMap,
        durability: DurabilitySettings,
        lanes: Mapping[str, LaneClasses] | None = None,
        config: FairlaneConfig | Path | str | None = None,
        charge: Literal["jobs", "cost"] = "cost",
        payloads: PayloadStore | str | None = None,
    ) -> None:
        self.name = name
        self.settings = settings
        #: scheduling shards (``fairlane.policy.shards``): every process of an app uses
        #: the same count; the app's stores share this map
        self.shard_map = shards
        #: what every enqueue waits for replicas or AOF fsyncs to confirm, unless the
        #: call says otherwise
        self.durability = durability
        self.tasks: dict[str, TaskDefinition[Any, Any]] = {}
        self.crons: dict[str, CronEntry] = {}
        self.lane_tables = LaneTables()
        if settings.lanes_file is not None:
            path = settings.lanes_file
            for lane, table in load_lanes(path).items():
                self.lane_tables.declare(lane, table, source=f"lanes_file {path}")
        for lane, classes in (lanes or {}).items():
            self.lane_tables.declare(lane, classes, source="App(lanes=...)")
        if config is not None and not isinstance(config, FairlaneConfig):
            config = load_config(config)
        # a config's [retry] gives tasks their default attempt budget and backoff
        self.task_defaults = dict(TASK_DEFAULTS)
        if config is not None:
            self.task_defaults["attempts"] = config.retry.max_attempts
            self.task_defaults["backoff"] = config.retry.backoff
        if charge not in ("jobs", "cost"):
            raise ValueError(f'charge must be "jobs" or "cost", got {charge!r}')
        #: how tenants are charged for fair shares: one unit per job, or what jobs cost
        self.charge = charge
        #: pools (lanes with admission control), retry and estimation settings
        self.config: FairlaneConfig = config or FairlaneConfig()
        for lane, pool in self.config.pools.items():
            self.lane_tables.declare(lane, pool.table, source="App(config=...)")
        # how declared estimates become reservations, and rejections' Retry-After
        self.pricing = Pricing(
            self.config.coefficients,
            self.config.estimation,
            self.config.retry.retry_after_policy,
        )
        #: large arguments and results go to this payload store; None keeps them in
        #: the server
        self.payloads = _payloads(payloads, settings)
        #: what every task's jobs are made with
        self.factory = JobFactory(
            self.lane_tables, self.pricing, shards, self.payloads, settings.max_payload_bytes
        )

    @property
    def shards(self) -> int:
        """How many scheduling shards the app has."""
        return self.shard_map.count

    # -- lanes -----------------------------------------------------------------------

    def lane(self, name: str, classes: LaneClasses, *, source: str) -> ClassTable:
        """Declare a lane's service classes, checked against the tasks already on it."""
        table = self.lane_tables.declare(name, classes, source=source)
        try:
            for task in self.tasks.values():
                if task.options.lane == name:
                    self.check_class(task.options)
        except ValueError:
            self.lane_tables.forget(name)  # a refused declaration leaves nothing behind
            raise
        return table

    @property
    def lanes(self) -> dict[str, ClassTable]:
        """The lanes declared, with their class tables."""
        return dict(self.lane_tables.items())

    def lane_classes(self, lane: str) -> ClassTable:
        """The class table jobs of ``lane`` are dispatched by: as declared, else the default."""
        return self.lane_tables.table(lane)

    def lanes_in_use(self) -> list[str]:
        """Every lane a task is on, the default lane, and every lane declared, sorted."""
        used = {task.options.lane for task in self.tasks.values()}
        used.add(self.settings.default_lane)
        return sorted(used | {lane for lane, _ in self.lane_tables.items()})

    def lanes_used(self) -> list[str]:
        """The lanes jobs of this app can be in: its tasks' lanes and the default lane."""
        used = {task.options.lane for task in self.tasks.values()}
        return sorted(used | {self.settings.default_lane})

    def check_class(self, options: TaskOptions) -> None:
        try:
            self.lane_tables.check_class(options.lane, options.service_class)
        except ValueError as exc:
            raise ValueError(f"task {options.name}: {exc}") from None

    def check_lanes(self) -> None:
        """Raise ``ValueError`` if a task's service class is not in its lane's table."""
        for task in self.tasks.values():
            self.check_class(task.options)

    # -- tasks -----------------------------------------------------------------------

    def options(
        self,
        func: Callable[..., Any],
        name: str | None,
        lane: str | None,
        given: dict[str, Any],
        tenant_slots: int | None,
        *,
        decorator: str = "app.task(",
        gateway: bool = False,
        deadline_order: bool = False,
    ) -> TaskOptions:
        """A task's options: those given, the app's defaults for the rest (``UNSET``).

        A task given no name is named ``<module>.<qualname>`` (``registry.naming``: one
        of ``__main__`` is named after the module a worker imports, with a warning that
        shows the ``name=`` for ``decorator``)."""
        defaults = {k for k, v in given.items() if v is UNSET}
        values = {k: (self.task_defaults[k] if v is UNSET else v) for k, v in given.items()}
        if lane is None:
            defaults.add("lane")
        if not name:
            defaults.add("name")
        task_name = name or default_name(func, decorator)
        try:
            task_limits = check_limits(values["limits"])
            task_rates = check_rates(values["rates"])
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
            rates=task_rates,
            tenant_slots=tenant_slots,
            unknown_kwargs=values["unknown_kwargs"],
            gateway=gateway,
            deadline_order=deadline_order,
            defaults=frozenset(defaults),
        )
        # a lane declared later is checked by `lane()`; an undeclared one at connect
        if self.lane_tables.is_declared(options.lane):
            self.check_class(options)
        return options

    def check_function(self, func: Callable[..., Any], options: TaskOptions) -> None:
        """Refuse a function that cannot be a task under ``options``, or a taken name."""
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

    def add(self, task: TaskDefinition[Any, Any]) -> None:
        """Record a task checked by ``check_function``."""
        self.tasks[task.name] = task

    def add_cron(self, schedule: str, task: TaskDefinition[[], Any]) -> None:
        """Enqueue ``task`` on every tick of ``schedule``; a refused schedule takes the
        task back out, leaving nothing behind."""
        try:
            self.crons[task.name] = CronEntry(schedule, task)
        except ValueError:
            del self.tasks[task.name]
            raise

    def get(self, name: str) -> TaskDefinition[Any, Any]:
        try:
            return self.tasks[name]
        except KeyError:
            raise UnknownTask(f"no task named {name!r} in app {self.name!r}") from None

    # -- recording on the server -----------------------------------------------------

    async def declare(self, stores: Sequence[Store]) -> None:
        """Record tasks and lanes on every shard's store, once each shard is known to
        hold data of this library's store layout (``StoreLayoutError`` if not)."""
        for store in stores:
            await store.claim_layout()
        await self.declare_tasks(stores)
        await self.declare_lanes(stores)

    async def declare_tasks(self, stores: Sequence[Store]) -> None:
        """Record each task's retention on the server, where sweeps read it."""
        for task in self.tasks.values():
            keep = task.options.retention
            for store in stores:
                await store.declare_task(task.name, keep.completed.encode(), keep.failed.encode())

    async def declare_lanes(self, stores: Sequence[Store]) -> None:
        """Record each lane's class table, its admission config and its default queue
        bounds on the server, where dispatch and admission read them."""
        bounds = self.settings.queues.bounds.per_shard(self.shards)
        for lane in self.lanes_in_use():
            table = self.lane_classes(lane)
            pool = self.config.pools.get(lane)
            for store in stores:
                await store.declare_lane(lane, table, self.charge)
                await store.declare_admission(
                    lane, table, pool.admission if pool else None, self.config.estimation
                )
                # a lane with a pool is bounded by it; the others by the default bounds
                await store.declare_bounds(lane, None if pool else bounds)
