"""The typed calls into the Lua library: ``Store``, the store's whole surface.

``Store`` is one server (or shard) of one app: its connection and bounded calls
(``fairlane.store.base``) and, by concern, the calls that stand on it -- submission and
declarations (``submission``), tenants' settings (``tenancy``), jobs read and acted on
by id (``lookup``), waiting jobs cancelled by a filter (``drain``), the worker's
exchange, leases and waits (``exchange``), the index of large payloads
(``payloadindex``), every key of the shard at once (``keyspace``) -- and
a workflow run's (``runs``) and the app's API key records (``apikeys``). It makes no
policy decisions: the worker and the app decide; the scripts apply those decisions
atomically with the server's clock.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import redis.asyncio as aioredis

from fairlane.store.apikeys import KeyRecords
from fairlane.store.connection import create_client
from fairlane.store.drain import DrainCalls
from fairlane.store.durations import DurationCalls
from fairlane.store.exchange import WorkerCalls
from fairlane.store.gate import POOL_HEADROOM, CallGate
from fairlane.store.globalkeys import GlobalKeyCalls
from fairlane.store.keyspace import KeyspaceCalls, unlink_matching
from fairlane.store.lookup import JobCalls
from fairlane.store.memory import MemoryGauge
from fairlane.store.pausing import PauseCalls
from fairlane.store.payloadindex import PayloadIndexCalls
from fairlane.store.runs import RunStore
from fairlane.store.sockets import FAST_CONNECTIONS, POOL_CHECKS
from fairlane.store.submission import Submission
from fairlane.store.tenancy import TenantCalls

__all__ = ["Store", "redact_url", "unlink_matching"]


def redact_url(url: str) -> str:
    """The URL without its password, for logs and messages."""
    if "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"


class Store(
    Submission,
    TenantCalls,
    JobCalls,
    DrainCalls,
    WorkerCalls,
    PayloadIndexCalls,
    KeyspaceCalls,
    GlobalKeyCalls,
    PauseCalls,
    DurationCalls,
):
    """The typed face of one server (or shard) for one app."""

    @cached_property
    def runs(self) -> RunStore:
        """The store's side of this shard's durable workflow runs."""
        return RunStore(self)

    @cached_property
    def key_records(self) -> KeyRecords:
        """The app's API key records, on this store's connection (they live in the home
        shard whichever shard this store is)."""
        return KeyRecords(self.client, self.app, self.shards, self.audit_entries)

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
        wait for a server that may never answer. At most ``max_connections`` calls use
        the server at once (``fairlane.store.gate``); more wait their turn, each for up
        to ``socket_timeout``, and fail with ``StoreBusy`` only past that."""
        options: dict[str, Any] = dict(
            decode_responses=False,
            max_connections=max_connections + POOL_HEADROOM,
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
        wait = options["socket_timeout"]
        return cls(
            client,
            app,
            blocking=blocking,
            socket_timeout=wait,
            shards=shards,
            gates=(CallGate(max_connections, wait), CallGate(max_connections, wait)),
            url=url,
            connect_timeout=options["socket_connect_timeout"],
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
            gates=self.gates,
            url=self.url,
            connect_timeout=self.connect_timeout,
        )
        sibling.prepare_jobs = self.prepare_jobs
        sibling.audit_entries = self.audit_entries
        # one server's memory is one reading; a cluster's shards may live on other nodes
        cluster = isinstance(self.client, aioredis.RedisCluster)
        sibling.memory = MemoryGauge(self.memory.mark) if cluster else self.memory
        sibling._owns_clients = False
        return sibling
