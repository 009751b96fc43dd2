"""A store's connection to its server: clients, the function library, bounded calls.

``StoreBase`` owns the client of one server (or one shard), loads the function
library on connect unless the server holds this release's already (and again when a
restarted server has lost it), and runs every call within a bound: a reply slower
than ``socket_timeout`` fails the call with ``StoreUnavailable``, and a write the
server refuses at its memory limit fails with ``StoreFull``. Its ``memory`` gauge
(``fairlane.store.memory``) is what submissions pass first. The calls the server
holds on purpose (an idle worker's BLPOP, WAIT) use a second client without a read
timeout, each bounded by its own wait plus ``socket_timeout``. The typed calls
(``fairlane.store.api``) stand on it, and so do the read models
(``fairlane.store.views``), which it runs with :meth:`read`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence
from functools import cached_property
from typing import Any, Concatenate, Final, ParamSpec, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.exceptions import (
    ClusterError,
    MaxConnectionsError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fairlane.store.connection import AsyncClient, close_subscription, server_time_ms
from fairlane.store.gate import CallGate, StoreBusy, raise_if_cancelling
from fairlane.store.keys import AppKeys
from fairlane.store.library import FUNCTION_PREFIX, LIBRARY_CODE, LIBRARY_NAME
from fairlane.store.memory import MemoryGauge, out_of_memory, server_full
from fairlane.store.reads import Plan, run_async
from fairlane.store.wire import StoreError, StoreUnavailable

__all__ = ["StoreBase", "unavailable"]

P = ParamSpec("P")
T = TypeVar("T")

_FN: Final = FUNCTION_PREFIX
# what a cluster answers while a slot changes hands (ClusterError covers CLUSTERDOWN)
_CLUSTER_IN_TRANSITION: Final = (ClusterError, TryAgainError, SlotNotCoveredError)


@contextlib.contextmanager
def unavailable() -> Iterator[None]:
    """A server that cannot be reached, or a slot in transition, as ``StoreUnavailable``;
    a write refused at the server's memory limit as ``StoreFull``."""
    try:
        yield
    except StoreError:
        raise
    except MaxConnectionsError as exc:
        # a pool with every connection taken: the server was never asked
        raise_if_cancelling()
        raise StoreBusy(f"every connection of the app's pool is in use: {exc}") from exc
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        raise_if_cancelling()
        raise StoreUnavailable(f"the Redis server is unreachable: {exc}") from exc
    except _CLUSTER_IN_TRANSITION as exc:
        # a failover or a slot migration under way: the slot answers again shortly
        raise_if_cancelling()
        raise StoreUnavailable(f"the Redis cluster cannot serve the app's slot: {exc}") from exc
    except RedisClusterException as exc:
        raise_if_cancelling()
        if not _slot_map_lost(exc):
            raise
        raise StoreUnavailable(f"the Redis cluster cannot serve the app's slot: {exc}") from exc
    except (AttributeError, TypeError) as exc:
        # a connection the server closed while the client was writing on it: redis-py
        # versions in our range let the torn-down stream's own error out (its writer or
        # transport already None) instead of a ConnectionError; any other such error is
        # a bug, and is raised as it is
        if not _torn_connection(exc):
            raise
        raise_if_cancelling()
        raise StoreUnavailable(f"the Redis server closed the connection: {exc!r}") from exc
    # -- the store full: not unavailable, and not a raw client error ----------------------
    except ResponseError as exc:
        if not out_of_memory(exc):
            raise
        raise server_full(exc) from exc


#: where a torn-down connection's writes fail: redis-py's connections, asyncio's streams
_TORN_IN: Final = (
    "redis/asyncio/connection.py",
    "asyncio/streams.py",
    "asyncio/selector_events.py",
)


def _torn_connection(exc: BaseException) -> bool:
    """Whether ``exc`` was raised writing on a connection whose stream was torn down: its
    innermost frame is in redis-py's connection or in asyncio's stream and transport."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith(_TORN_IN)


def _slot_map_lost(exc: RedisClusterException) -> bool:
    """Whether a cluster client gave up reloading its slot map for an outage: no node could
    be reached, or (redis-py 8.2 on) the reload that a CLUSTERDOWN answer set off found a
    slot without a node. redis-py raises the bare ``RedisClusterException`` for both, and
    for its callers' mistakes too (a command it cannot route, a server not in cluster
    mode), which are not waited out: the error it was handling tells them apart."""
    reason = exc.__cause__ or exc.__context__
    return isinstance(
        reason, (RedisConnectionError, RedisTimeoutError, OSError, *_CLUSTER_IN_TRANSITION)
    )


class StoreBase:
    """One server (or shard) of one app: its clients, keys and library."""

    def __init__(
        self,
        client: AsyncClient,
        app: str,
        *,
        blocking: AsyncClient | None = None,
        socket_timeout: float | None = None,
        shard: int = 0,
        shards: int = 1,
        gates: tuple[CallGate, CallGate] | None = None,
        url: str | None = None,
        connect_timeout: float | None = None,
    ) -> None:
        self.client = client
        # Calls the server holds on purpose (BLPOP, WAIT) go through a client without a
        # read timeout, each bounded by its own wait plus ``socket_timeout``: the read
        # timeout of ``client`` is shorter than an idle worker's block.
        self.blocking = blocking or client
        #: how many calls of the app use ``client`` and ``blocking`` at once (each its
        #: own pool), shared with the sibling shards' stores
        self.gates = gates or (CallGate(64, socket_timeout), CallGate(64, socket_timeout))
        self.socket_timeout = socket_timeout
        #: the server's URL and connect timeout, when the store was made from a URL: what
        #: a blocking twin of a call connects with, from a thread (``store/beats.py``)
        self.url = url
        self.connect_timeout = connect_timeout
        self.app = app
        #: this store's scheduling shard, of ``shards`` (``fairlane.policy.shards``)
        self.shard = shard
        self.shards = shards
        self.keys = AppKeys.for_shard(app, shard, shards)
        self._common = self.keys.common()
        # the key list of each lane an enqueue names (the app's lanes: a few)
        self._one_lane: dict[str, list[str]] = {}
        # a sibling shares its parent's clients, which the parent closes
        self._owns_clients = True
        #: the server's memory as submissions read it (shared by the stores of a server)
        self.memory = MemoryGauge()

    @cached_property
    def all_keys(self) -> list[AppKeys]:
        """The keys of every shard of the app, in shard order (this one's among them)."""
        return [
            self.keys if i == self.shard else AppKeys.for_shard(self.app, i, self.shards)
            for i in range(self.shards)
        ]

    async def connect(self) -> None:
        """Check the server answers, load the function library unless the server holds
        this release's, and take a first reading of its memory."""
        await self._call(self.client.ping)
        # a server at its memory limit refuses FUNCTION LOAD, but not the look first:
        # workers start there as long as the library is in place
        if not await self.library_loaded():
            await self.load_library()
        await self.memory.refresh(self.read_memory)

    async def load_library(self) -> None:
        await self._call(self.client.function_load, LIBRARY_CODE, replace=True)

    async def library_loaded(self) -> bool:
        """Whether the server (every primary of a cluster) holds this release's library.
        Its name carries its content's digest, so a library of that name is this one."""
        command = ("FUNCTION LIST", "LIBRARYNAME", LIBRARY_NAME)
        try:
            if not isinstance(self.client, aioredis.RedisCluster):
                return bool(await self._call(self.client.execute_command, *command))
            await self._call(self.client.initialize)
            for node in self.client.get_primaries():
                if not await self._call(self.client.execute_command, *command, target_nodes=node):
                    return False
        except ResponseError:
            return False  # a user who may not list functions: load, as before the look
        return True

    async def read_memory(self) -> Any:
        """``INFO memory`` of the server that holds the app's slot."""
        return await self._call(self.client.info, "memory", **await self.slot_node())

    async def aclose(self) -> None:
        if not self._owns_clients:
            return
        await self.client.aclose()
        if self.blocking is not self.client:
            await self.blocking.aclose()

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        async with self.gates[0].slot():
            with unavailable():
                reply = await fn(*args, **kwargs)
        # on Python 3.11 the client's own `asyncio.wait_for` (writing a command) returns
        # the result of a write that finished as the task was cancelled, dropping the
        # cancel: the loop that called would then outlive its worker's cancellation
        raise_if_cancelling()
        return reply

    async def read(self, plan: Plan[T]) -> T:
        """Run a read model's plan (``fairlane.store.views``) on this store's client:
        keys of every shard, as the shards share one client."""
        async with self.gates[0].slot():
            with unavailable():
                reply = await run_async(self.client, plan)
        raise_if_cancelling()  # as in `_call`
        return reply

    async def view(
        self,
        model: Callable[Concatenate[Sequence[AppKeys], P], Plan[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Read ``model`` over every shard of the app: ``model(all_keys, ...)``."""
        return await self.read(model(self.all_keys, *args, **kwargs))

    async def subscribe(self, *channels: str) -> PubSub:
        """A subscription to ``channels`` (messages only, not the confirmations), on a
        connection of its own; the caller closes it."""
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            with unavailable():
                await pubsub.subscribe(*channels)
        except BaseException:
            await close_subscription(pubsub)
            raise
        return pubsub

    async def blocking_call(self, wait: float, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """A call the server may hold for ``wait`` seconds, bounded by that plus the
        read timeout (a call cut off there drops its connection, which may be dead)."""
        limit = None if self.socket_timeout is None else wait + self.socket_timeout
        try:
            # the wait for a place on the blocking client is bounded by the gate itself
            async with self.gates[1].slot(), asyncio.timeout(limit):
                with unavailable():
                    reply = await fn(*args, **kwargs)
        except TimeoutError as exc:
            raise_if_cancelling()
            raise StoreUnavailable(f"the Redis server did not answer within {limit}s") from exc
        raise_if_cancelling()  # as in `_call`
        return reply

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
        return int(await self._call(server_time_ms, self.client, self.keys.stats))

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
        if len(lanes) == 1:  # every enqueue: the lane's key list, made once
            one = self._one_lane.get(lanes[0])
            if one is None:
                one = self._one_lane[lanes[0]] = self._lane_keys_of(lanes)
            return list(one)
        return self._lane_keys_of(lanes)

    def _lane_keys_of(self, lanes: Sequence[str]) -> list[str]:
        out = list(self._common)
        for lane in lanes:
            out.extend(self.keys.lane(lane).as_list())
        return out
