"""Typed calls into the Lua library: the store's whole surface.

``Store`` owns the client of one server (or one shard), loads the function
library on connect (and again when a restarted server has lost it), and turns each
script's flat reply into typed values. It makes no policy decisions: the worker and
the app decide; the scripts apply those decisions atomically with the server's clock.

No call waits on the server without a bound: a reply slower than ``socket_timeout``
fails the call with ``StoreUnavailable``. The calls the server holds on purpose (an
idle worker's BLPOP, WAIT) use a second client without a read timeout, each bounded
by its own wait plus ``socket_timeout``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import ClusterError, ResponseError, SlotNotCoveredError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fairlane.policy.admission import EstimationSettings, PoolConfig
from fairlane.policy.ceilings import TenantLimits
from fairlane.policy.classes import ClassTable
from fairlane.store.connection import AsyncClient, create_client, slot_client
from fairlane.store.explain import Event, decode_event
from fairlane.store.keys import AppKeys
from fairlane.store.library import (
    FUNCTION_PREFIX,
    LIBRARY_CODE,
    encode_admission,
    encode_classes,
)
from fairlane.store.runs import RunStore
from fairlane.store.sockets import FAST_CONNECTIONS, POOL_CHECKS
from fairlane.store.wire import (
    UNPACK_JOB,
    UNPACK_JOBS,
    UNPACK_RAWS,
    Fetched,
    FetchedJob,
    LaneState,
    NewJob,
    Outcome,
    StoreUnavailable,
    Submitted,
    TenantSignal,
    as_text,
    decode_limits,
    decode_rows,
    encode_limits,
    parse_fetched,
    parse_submitted,
)

_FN: Final = FUNCTION_PREFIX
# what a cluster answers while a slot changes hands (ClusterError covers CLUSTERDOWN)
_CLUSTER_IN_TRANSITION: Final = (ClusterError, TryAgainError, SlotNotCoveredError)

# Batches travel as one msgpack argument / reply: one argument to pack instead of
# five per job, and one buffer to parse instead of eleven reply elements per job.
_PACK: Final = msgspec.msgpack.Encoder()


def redact_url(url: str) -> str:
    """The URL without its password, for logs and messages."""
    if "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"


async def unlink_matching(client: AsyncClient, pattern: str) -> int:
    """Delete every key matching a SCAN ``pattern``, in batches; returns how many.

    On a cluster, SCAN runs on every primary and UNLINK is split by slot.
    """
    removed = 0
    batch: list[bytes] = []
    async for key in client.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 500:
            removed += await client.unlink(*batch)
            batch.clear()
    if batch:
        removed += await client.unlink(*batch)
    return removed


class Store:
    """The typed face of one server (or shard) for one app."""

    def __init__(
        self,
        client: AsyncClient,
        app: str,
        *,
        blocking: AsyncClient | None = None,
        socket_timeout: float | None = None,
        shard: int = 0,
        shards: int = 1,
    ) -> None:
        self.client = client
        # Calls the server holds on purpose (BLPOP, WAIT) go through a client without a
        # read timeout, each bounded by its own wait plus ``socket_timeout``: the read
        # timeout of ``client`` is shorter than an idle worker's block.
        self.blocking = blocking or client
        self.socket_timeout = socket_timeout
        self.app = app
        #: this store's scheduling shard, of ``shards`` (``fairlane.policy.shards``)
        self.shard = shard
        self.shards = shards
        self.keys = AppKeys.for_shard(app, shard, shards)
        self._common = self.keys.common()
        # a sibling shares its parent's clients, which the parent closes
        self._owns_clients = True
        self.runs = RunStore(self)
        #: what jobs pass through before they are sent (the app's payload offload,
        #: ``fairlane.payloads``); None sends them as they are
        self.prepare_jobs: (
            Callable[[Store, Sequence[NewJob]], Awaitable[Sequence[NewJob]]] | None
        ) = None

    @classmethod
    def from_url(
        cls,
        url: str,
        app: str,
        *,
        max_connections: int = 64,
        shards: int = 1,
        **connection_kwargs: Any,
    ) -> Store:
        """A store on ``url``: any form ``fairlane.store.connection`` reads (one server,
        ``redis+cluster://``, ``redis+sentinel://``); ``connection_kwargs`` override the
        connection options below.

        A call that gets no reply within ``socket_timeout`` seconds, or no connection
        within ``socket_connect_timeout``, fails with ``StoreUnavailable`` rather than
        wait for a server that may never answer."""
        options: dict[str, Any] = dict(
            decode_responses=False,
            max_connections=max_connections,
            socket_connect_timeout=2.0,
            socket_timeout=5.0,
            health_check_interval=30,
            **POOL_CHECKS,
        )
        options.update(connection_kwargs)
        client = create_client(url, **options)
        blocking = create_client(url, **{**options, "socket_timeout": None})
        for made in (client, blocking):
            if isinstance(made, aioredis.Redis):
                pool = made.connection_pool
                pool.connection_class = FAST_CONNECTIONS.get(
                    pool.connection_class, pool.connection_class
                )
        return cls(
            client,
            app,
            blocking=blocking,
            socket_timeout=options["socket_timeout"],
            shards=shards,
        )

    def shard_store(self, shard: int, shards: int) -> Store:
        """The store of another shard of the same app, on this store's connections."""
        sibling = Store(
            self.client,
            self.app,
            blocking=self.blocking,
            socket_timeout=self.socket_timeout,
            shard=shard,
            shards=shards,
        )
        sibling.prepare_jobs = self.prepare_jobs
        sibling._owns_clients = False
        return sibling

    async def connect(self) -> None:
        """Check the server answers and load the function library."""
        await self._call(self.client.ping)
        await self.load_library()

    async def load_library(self) -> None:
        await self._call(self.client.function_load, LIBRARY_CODE, replace=True)

    async def aclose(self) -> None:
        if not self._owns_clients:
            return
        await self.client.aclose()
        if self.blocking is not self.client:
            await self.blocking.aclose()

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise StoreUnavailable(f"the Redis server is unreachable: {exc}") from exc
        except _CLUSTER_IN_TRANSITION as exc:
            # a failover or a slot migration under way: the slot answers again shortly
            raise StoreUnavailable(f"the Redis cluster cannot serve the app's slot: {exc}") from exc

    async def blocking_call(self, wait: float, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """A call the server may hold for ``wait`` seconds, bounded by that plus the
        read timeout (a call cut off there drops its connection, which may be dead)."""
        limit = None if self.socket_timeout is None else wait + self.socket_timeout
        try:
            async with asyncio.timeout(limit):
                return await self._call(fn, *args, **kwargs)
        except TimeoutError as exc:
            raise StoreUnavailable(f"the Redis server did not answer within {limit}s") from exc

    async def slot_node(self) -> dict[str, Any]:
        """On a cluster, ``{"target_nodes": node}`` for the node holding the app's slot
        (else nothing): for commands that name no key, such as TIME, which must reach
        the node whose clock and data the scripts use."""
        if not isinstance(self.client, aioredis.RedisCluster):
            return {}
        await self._call(self.client.initialize)
        return {"target_nodes": self.client.get_node_from_key(self.keys.stats)}

    async def server_time_ms(self) -> int:
        """The server's clock in ms (the clock of the app's slot on a cluster)."""
        seconds, micros = await self._call(self.client.time, **await self.slot_node())
        return int(seconds) * 1000 + int(micros) // 1000

    async def fcall(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Call a library function, reloading the library once if the server lost it."""
        # A cluster client finds an FCALL's keys by asking the server (COMMAND GETKEYS),
        # a round trip per call; every key shares one slot, so the node is named here.
        route = await self.slot_node()
        command = ("FCALL", _FN + name, len(keys), *keys, *args)
        try:
            return await self._call(self.client.execute_command, *command, **route)
        except ResponseError as exc:
            if "Function not found" not in str(exc):
                raise
            await self.load_library()
            return await self._call(self.client.execute_command, *command, **route)

    def _lane_keys(self, lanes: Sequence[str]) -> list[str]:
        out = list(self._common)
        for lane in lanes:
            out.extend(self.keys.lane(lane).as_list())
        return out

    # -- producer side ----------------------------------------------------------------

    async def submit(self, lane: str, jobs: Sequence[NewJob]) -> list[Submitted]:
        """Pass jobs through the lane's admission and store those admitted or deferred,
        in one atomic step; one reply per job (codes as the enqueue script says)."""
        blob = _PACK.encode(await self.prepare(jobs))
        return parse_submitted(await self.fcall("enqueue", self._lane_keys([lane]), [lane, blob]))

    async def prepare(self, jobs: Sequence[NewJob]) -> Sequence[NewJob]:
        """Jobs as they are to be sent: arguments over the payload threshold stored in
        the app's payload store and replaced by references. Every enqueue path calls it."""
        hook = self.prepare_jobs
        return jobs if hook is None else await hook(self, jobs)

    def enqueue_call(self, lane: str, jobs: Sequence[NewJob]) -> tuple[Any, ...]:
        """The enqueue FCALL's arguments, for a caller that sends it in a pipeline."""
        keys = self._lane_keys([lane])
        return (_FN + "enqueue", len(keys), *keys, lane, _PACK.encode(jobs))

    async def enqueue(self, lane: str, jobs: Sequence[NewJob]) -> list[tuple[str, int]]:
        """Store jobs atomically; returns (id, code) per job: 1 new, 2 deferred, 0 existing,
        negative: refused (nothing written)."""
        return [(s.id, s.code) for s in await self.submit(lane, jobs)]

    async def declare_admission(
        self,
        lane: str,
        table: ClassTable,
        pool: PoolConfig | None,
        estimation: EstimationSettings | None = None,
    ) -> None:
        """Record a lane's admission config (None: no admission control in the lane)."""
        config, units = "", ""
        if pool is not None:
            config, units = encode_admission(table, pool, estimation or EstimationSettings())
        await self.fcall("declare_admission", self._lane_keys([lane]), [lane, config, units])

    async def declare_task(self, task: str, keep_completed: str, keep_failed: str) -> None:
        await self.fcall("declare_task", self._common, [task, f"{keep_completed}|{keep_failed}"])

    async def configure_tenant(self, tenant: str, weight: float | None) -> None:
        """Set a tenant's fair-share weight (None: back to the default of 1)."""
        value = "" if weight is None else repr(float(weight))
        await self.fcall("configure_tenant", self._common, [tenant, value])

    async def configure_tenant_limits(self, tenant: str, limits: TenantLimits | None) -> None:
        """Set a tenant's concurrency settings (None: no tenant key at all)."""
        await self.fcall("configure_limits", self._common, [tenant, encode_limits(limits)])

    async def update_tenant_limits(
        self, tenant: str, change: Callable[[TenantLimits | None], TenantLimits | None]
    ) -> TenantLimits | None:
        """Replace a tenant's settings by ``change(current)`` as one atomic step.

        Optimistic: the read and the write run under WATCH, and the whole step is
        retried if any tenant's settings changed in between, so two clients
        configuring different fields of one tenant never lose either change.
        """

        async def step(pipe: Any) -> TenantLimits | None:
            new = change(decode_limits(await pipe.hget(self.keys.tlimits, tenant)))
            pipe.multi()
            pipe.fcall(
                _FN + "configure_limits",
                len(self._common),
                *self._common,
                tenant,
                encode_limits(new),
            )
            return new

        async with slot_client(self.client, self.keys.tlimits) as client:
            result: TenantLimits | None = await self._call(
                client.transaction, step, self.keys.tlimits, value_from_callable=True
            )
        return result

    async def tenant_limits(self, tenant: str) -> TenantLimits | None:
        return decode_limits(await self._call(self.client.hget, self.keys.tlimits, tenant))

    async def tenant_limit_now(self, lane: str, tenant: str) -> TenantSignal:
        """The tenant's concurrency limit in ``lane`` now, and the signals behind it."""
        limit, rate, mean, cap, load = await self.fcall(
            "tenant_limit_now", self._lane_keys([lane]), [lane, tenant]
        )
        return TenantSignal(
            None if int(limit) < 0 else int(limit), float(rate), float(mean), int(cap), int(load)
        )

    async def declare_lane(self, lane: str, classes: ClassTable, charge: str = "jobs") -> None:
        """Record a lane's service classes and how its tenants are charged ("jobs": one
        unit per job; "cost": what each job was learned to cost, corrected as it ends);
        the next decision in the lane uses them."""
        await self.fcall(
            "declare_lane", self._lane_keys([lane]), [lane, encode_classes(classes), charge]
        )

    async def lane_state(self, lane: str) -> LaneState:
        """A lane's capacity and its classes' in-flight and waiting slots, as cached."""
        raw = await self._call(self.client.hgetall, self.keys.lane(lane).state)
        fields = {as_text(k): as_text(v) for k, v in raw.items()}
        in_flight = {k[2:]: int(v) for k, v in fields.items() if k.startswith("f:")}
        waiting = {k[2:]: int(v) for k, v in fields.items() if k.startswith("d:")}
        return LaneState(int(fields.get("C", 0)), in_flight, waiting)

    async def tenant_weight(self, tenant: str) -> float:
        raw = await self._call(self.client.hget, self.keys.weights, tenant)
        return float(raw) if raw is not None else 1.0

    async def cancel(self, job_id: str) -> str:
        return as_text(await self.fcall("cancel", self._common, [job_id]))

    async def watch(self, job_id: str) -> list[bytes]:
        return list(await self.fcall("watch", self._common, [job_id]))

    async def job_fields(self, job_id: str, *fields: str) -> list[bytes | None]:
        return list(await self._call(self.client.hmget, self.keys.job(job_id), list(fields)))

    async def job_record(self, job_id: str) -> dict[str, bytes]:
        raw = await self._call(self.client.hgetall, self.keys.job(job_id))
        return {as_text(k): v for k, v in raw.items()}

    async def job_events(self, job_id: str) -> list[Event]:
        """A job's lifecycle events, oldest first (the last 64 the store kept)."""
        raw = await self._call(self.client.lrange, self.keys.events(job_id), 0, -1)
        return [decode_event(entry) for entry in raw]

    async def redrive(self, ids: Sequence[str] = (), limit: int = 100) -> list[str]:
        reply = await self.fcall("redrive", self._common, [limit, *ids])
        return [as_text(x) for x in reply]

    async def dead_letters(self, limit: int = 100) -> list[tuple[str, float]]:
        raw = await self._call(self.client.zrange, self.keys.dead, 0, limit - 1, withscores=True)
        return [(as_text(member), float(score)) for member, score in raw]

    async def stats(self) -> dict[str, int]:
        raw = await self._call(self.client.hgetall, self.keys.stats)
        return {as_text(k): int(v) for k, v in raw.items()}

    # -- worker side ------------------------------------------------------------------

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
        blob = _PACK.encode((outcomes, worker, want, lease_ms, promote_limit, lanes, idle_ms, size))
        reply = await self.fcall("exchange", self._lane_keys(lanes), [blob])
        return parse_fetched(reply)

    async def leave(self, worker: str, lease_ms: int, lanes: Sequence[str]) -> list[FetchedJob]:
        """Deregister a stopping worker; returns jobs handed to it that it must hand back."""
        blob = _PACK.encode((worker, lease_ms, lanes))
        reply = await self.fcall("leave", self._lane_keys(lanes), [blob])
        try:
            return UNPACK_JOBS.decode(reply)
        except msgspec.ValidationError:
            # a row it cannot read is not handed back: its lease expires and it is reclaimed
            return decode_rows(UNPACK_RAWS.decode(reply))[0]

    async def ack(self, lanes: Sequence[str], outcomes: Sequence[Outcome]) -> list[int]:
        blob = _PACK.encode(outcomes)
        return [int(c) for c in await self.fcall("ack", self._lane_keys(lanes), [blob])]

    async def renew(
        self, worker: str, lease_ms: int, held: Sequence[tuple[str, str]]
    ) -> tuple[list[str], list[str]]:
        """Extend held leases; returns (ids whose lease is lost, ids asked to cancel)."""
        args: list[Any] = [worker, lease_ms]
        for job_id, token in held:
            args.extend((job_id, token))
        lost, cancel = await self.fcall("renew", self._common, args)
        return [as_text(x) for x in lost], [as_text(x) for x in cancel]

    async def sweep(
        self, limit: int, seed: int, stale_worker_ms: int
    ) -> tuple[list[str], list[str]]:
        """Reclaim expired leases; returns (ids scheduled for retry, ids dead-lettered)."""
        retried, dead = await self.fcall("sweep", self._common, [limit, seed, stale_worker_ms])
        return [as_text(x) for x in retried], [as_text(x) for x in dead]

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
