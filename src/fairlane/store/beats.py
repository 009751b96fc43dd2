"""The worker's beat on a blocking connection of its own, for the thread that beats.

A worker beats from a thread beside its event loop (``runtime/beating.py``), so that a
task blocking the loop does not silence it; the loop's async clients belong to the
loop and cannot serve that thread. ``BeatLine`` is the blocking twin of
``WorkerCalls.beat`` (``store/exchange.py``): the same keys, library function and
arguments, on a sync client of the same deployment (``create_sync_client``: one
server, a cluster or Sentinel) made from the URL and timeouts the store was opened
with. The client is made by the first call, in the thread that calls (a cluster
client connects as it is made), and closed by that thread.

Every call is one attempt (no retry, no backoff), so it ends within ``bound``, the
connect timeout plus the read timeout: a server that cannot be reached fails the call
with ``StoreUnavailable`` there, and the next beat tries again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, ResponseError
from redis.retry import Retry

from fairlane.store.base import StoreBase, unavailable
from fairlane.store.connection import SyncClient, create_sync_client
from fairlane.store.exchange import BEAT, beat_args, beat_reply
from fairlane.store.keys import AppKeys
from fairlane.store.library import FUNCTION_PREFIX, LIBRARY_CODE
from fairlane.store.sockets import POOL_CHECKS
from fairlane.store.wire import StoreUnavailable

__all__ = ["BeatLine"]

#: the read timeout of a store made without one (``Store.from_url``'s default)
_DEFAULT_TIMEOUT: Final = 5.0


class BeatLine:
    """Beats of one worker in every shard of its app, on one blocking client."""

    def __init__(
        self,
        url: str,
        app: str,
        shards: int,
        *,
        socket_timeout: float,
        connect_timeout: float,
    ) -> None:
        self.url = url
        self.shards = shards
        keys = [AppKeys.for_shard(app, shard, shards) for shard in range(shards)]
        # each shard's key list, as the async call sends it, and a key of its slot
        self._keys: list[Sequence[str]] = [k.common() for k in keys]
        self._slot_keys = [k.stats for k in keys]
        self._options: dict[str, Any] = dict(
            decode_responses=False,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            retry=Retry(NoBackoff(), 0),
            **POOL_CHECKS,
        )
        #: the longest one call takes before it fails: a connection, then a reply
        self.bound = connect_timeout + socket_timeout
        self._client: SyncClient | None = None

    @classmethod
    def of(cls, store: StoreBase) -> BeatLine:
        """The beats of ``store``'s app, on the server it was opened on."""
        if store.url is None:
            raise ValueError("a worker's stores must be opened from a URL (Store.from_url)")
        timeout = store.socket_timeout or _DEFAULT_TIMEOUT
        return cls(
            store.url,
            store.app,
            store.shards,
            socket_timeout=timeout,
            connect_timeout=store.connect_timeout or timeout,
        )

    def beat(
        self, shard: int, worker: str, dead_ms: int, limit: int, seed: int
    ) -> tuple[list[str], list[str], list[str]]:
        """``worker``'s beat in ``shard``, as ``WorkerCalls.beat``: reclaims up to
        ``limit`` jobs of workers that beat and then fell silent for ``dead_ms``.
        Returns (ids scheduled for retry, ids dead-lettered, the dead workers looked at)."""
        return beat_reply(self._fcall(shard, beat_args(worker, dead_ms, limit, seed)))

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def _fcall(self, shard: int, args: Sequence[Any]) -> Any:
        keys = self._keys[shard]
        command = ("FCALL", FUNCTION_PREFIX + BEAT, len(keys), *keys, *args)
        client = self._connected()
        with unavailable():
            # every key of a shard shares one slot: its node is named, not looked up
            route: dict[str, Any] = {}
            if isinstance(client, redis.RedisCluster):
                node_of: Any = client.get_node_from_key  # redis-py leaves it unannotated
                route["target_nodes"] = node_of(self._slot_keys[shard])
            run: Any = client.execute_command
            try:
                return run(*command, **route)
            except ResponseError as exc:
                if "Function not found" not in str(exc):
                    raise
                # a server restarted without persistence lost the library
                client.function_load(LIBRARY_CODE, replace=True)
                return run(*command, **route)

    def _connected(self) -> SyncClient:
        if self._client is None:
            try:
                with unavailable():
                    self._client = create_sync_client(self.url, **self._options)
            except RedisClusterException as exc:  # no node of the cluster answered
                raise StoreUnavailable(f"the Redis cluster is unreachable: {exc}") from exc
        return self._client
