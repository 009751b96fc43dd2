"""Turning a server address into a client: standalone, Redis Cluster or Sentinel.

This module owns the URL forms Fairlane accepts and the clients built from them.
Everything else names a server by one URL string (``FAIRLANE_REDIS_URL``, ``App(
redis_url=...)``, the CLI), so a worker started from the command line reaches the
same deployment as the app that enqueued its jobs:

- ``redis://``, ``rediss://``, ``unix://``: one server, as redis-py reads them.
- ``redis+cluster://[user:password@]host:port[,host:port...][/]`` (``rediss+cluster``
  for TLS): a Redis Cluster, given by any of its nodes; the client discovers the rest.
- ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]``
  (``rediss+sentinel`` for TLS to the data nodes): the master Sentinel names for
  ``service``, followed across failovers. The credentials are the data nodes'.

:func:`cluster_url` and :func:`sentinel_url` write these URLs from lists of nodes;
:func:`create_client` and :func:`create_sync_client` build the async and sync clients.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeAlias
from urllib.parse import quote, unquote

import msgspec
import redis
import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.sentinel import Sentinel
from redis.cluster import ClusterNode as SyncClusterNode
from redis.sentinel import Sentinel as SyncSentinel

__all__ = [
    "AsyncClient",
    "Endpoint",
    "ServerAddress",
    "SyncClient",
    "close_subscription",
    "cluster_url",
    "create_client",
    "create_sync_client",
    "is_cluster",
    "parse_address",
    "sentinel_url",
    "server_time_ms",
    "slot_client",
    "sync_server_time_ms",
]

AsyncClient: TypeAlias = "aioredis.Redis | aioredis.RedisCluster"
SyncClient: TypeAlias = "redis.Redis | redis.RedisCluster"
Kind = Literal["standalone", "cluster", "sentinel"]
Endpoint = tuple[str, int]

_CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}
_SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}
_DEFAULT_PORT = 6379
_DEFAULT_SENTINEL_PORT = 26379


class ServerAddress(msgspec.Struct, frozen=True):
    """What a URL names: the kind of deployment, its nodes and the data nodes' login."""

    kind: Kind
    url: str  # as given; for a standalone server, what redis-py parses
    nodes: tuple[Endpoint, ...] = ()
    service_name: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False


def _endpoint(text: str, default_port: int) -> Endpoint:
    text = text.strip()
    if text.startswith("["):  # [IPv6]:port
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":")
    else:
        host, _, port_text = text.rpartition(":") if ":" in text else (text, "", "")
    if not host:
        raise ValueError(f"no host in {text!r}")
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        raise ValueError(f"bad port in {text!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"port out of range in {text!r}")
    return host, port


def _endpoints(netloc_hosts: str, default_port: int, url: str) -> tuple[Endpoint, ...]:
    parts = [p for p in netloc_hosts.split(",") if p.strip()]
    if not parts:
        raise ValueError(f"no host in {url!r}")
    try:
        return tuple(_endpoint(p, default_port) for p in parts)
    except ValueError as exc:
        raise ValueError(f"{exc} (in {_redacted(url)!r})") from None


def _redacted(url: str) -> str:
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"


def parse_address(url: str) -> ServerAddress:
    """Read a server URL (any form in this module's docstring); ``ValueError`` if malformed."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in _CLUSTER_SCHEMES and scheme not in _SENTINEL_SCHEMES:
        return ServerAddress("standalone", url)
    # urlsplit cannot read a comma-separated host list, so the authority is split by hand
    rest = url.partition("://")[2]
    authority, _, path = rest.partition("/")
    path, _, query = path.partition("?")
    if query or "?" in authority:
        raise ValueError(f"query parameters are not supported in {_redacted(url)!r}")
    userinfo, _, hosts = authority.rpartition("@")
    username: str | None = None
    password: str | None = None
    if userinfo:
        user, sep, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if sep else None
    if scheme in _CLUSTER_SCHEMES:
        if path.strip("/") not in ("", "0"):
            raise ValueError(f"a cluster has only database 0: {_redacted(url)!r}")
        nodes = _endpoints(hosts, _DEFAULT_PORT, url)
        return ServerAddress(
            "cluster",
            url,
            nodes,
            username=username,
            password=password,
            tls=_CLUSTER_SCHEMES[scheme],
        )
    segments = [unquote(s) for s in path.strip("/").split("/") if s]
    if not segments or len(segments) > 2:
        raise ValueError(
            f"a sentinel URL names the service, and optionally the database: "
            f"redis+sentinel://host:port,host:port/service[/db], not {_redacted(url)!r}"
        )
    try:
        db = int(segments[1]) if len(segments) == 2 else 0
    except ValueError:
        raise ValueError(f"bad database number in {_redacted(url)!r}") from None
    return ServerAddress(
        "sentinel",
        url,
        _endpoints(hosts, _DEFAULT_SENTINEL_PORT, url),
        service_name=segments[0],
        db=db,
        username=username,
        password=password,
        tls=_SENTINEL_SCHEMES[scheme],
    )


def _nodes_text(nodes: Iterable[str | Endpoint], default_port: int) -> str:
    out = []
    for node in nodes:
        host, port = _endpoint(node, default_port) if isinstance(node, str) else node
        out.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    if not out:
        raise ValueError("at least one node is needed")
    return ",".join(out)


def _userinfo(username: str | None, password: str | None) -> str:
    if username is None and password is None:
        return ""
    secret = "" if password is None else ":" + quote(password, safe="")
    return f"{quote(username or '', safe='')}{secret}@"


def cluster_url(
    nodes: Iterable[str | Endpoint],
    *,
    tls: bool = False,
    username: str | None = None,
    password: str | None = None,
) -> str:
    """The ``redis+cluster://`` URL of a cluster reached through ``nodes`` ("host:port")."""
    scheme = "rediss+cluster" if tls else "redis+cluster"
    return f"{scheme}://{_userinfo(username, password)}{_nodes_text(nodes, _DEFAULT_PORT)}/"


def sentinel_url(
    sentinels: Iterable[str | Endpoint],
    service_name: str,
    *,
    db: int = 0,
    tls: bool = False,
    username: str | None = None,
    password: str | None = None,
) -> str:
    """The ``redis+sentinel://`` URL of the master Sentinel names ``service_name``."""
    if not service_name or "/" in service_name:
        raise ValueError(f"bad sentinel service name {service_name!r}")
    scheme = "rediss+sentinel" if tls else "redis+sentinel"
    hosts = _nodes_text(sentinels, _DEFAULT_SENTINEL_PORT)
    service = quote(service_name, safe="")
    return f"{scheme}://{_userinfo(username, password)}{hosts}/{service}/{db}"


def _accepted(factory: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments ``factory`` takes.

    A cluster client refuses connection-pool options that make no sense per node
    (``connection_pool``, ``retry_on_timeout``, ...); callers pass one set of options
    for every kind of deployment, so those are left out here rather than refused.
    """
    params = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def _login(address: ServerAddress, kwargs: dict[str, Any]) -> dict[str, Any]:
    out = dict(kwargs)
    if address.username is not None:
        out.setdefault("username", address.username)
    if address.password is not None:
        out.setdefault("password", address.password)
    if address.tls:
        out.setdefault("ssl", True)
    return out


async def close_subscription(pubsub: PubSub) -> None:
    """Close ``pubsub`` and its connection; a typed call whichever redis-py is installed
    (it annotates ``PubSub.aclose`` from 8.2 on)."""
    close: Callable[[], Awaitable[None]] = pubsub.aclose
    await close()


def _untyped(factory: Any) -> Any:
    """``factory`` as ``Any``: redis-py leaves Sentinel and ClusterNode unannotated."""
    return factory


class _SentinelRedis(aioredis.Redis):
    """A master client that also closes the connections to the sentinels it asked."""

    owned_sentinel: Any = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        if self.owned_sentinel is not None:
            for client in self.owned_sentinel.sentinels:
                await client.aclose()


class _SyncSentinelRedis(redis.Redis):
    owned_sentinel: Any = None

    def close(self) -> None:
        super().close()
        if self.owned_sentinel is not None:
            for client in self.owned_sentinel.sentinels:
                client.close()


def _sentinel_kwargs(address: ServerAddress, kwargs: dict[str, Any]) -> dict[str, Any]:
    # the sentinels get the same socket settings and TLS as the data nodes, not their login
    out = {k: v for k, v in kwargs.items() if k.startswith("socket_")}
    if address.tls:
        out["ssl"] = True
    return out


class _Flavour(msgspec.Struct, frozen=True):
    """The client classes of one side of redis-py (asyncio or blocking)."""

    standalone: Any  # (url, options) -> a client of one server
    cluster: Any
    node: Any
    sentinel: Any
    sentinel_master: Any


def _async_standalone(url: str, options: dict[str, Any]) -> aioredis.Redis:
    return aioredis.Redis.from_pool(aioredis.ConnectionPool.from_url(url, **options))


def _sync_standalone(url: str, options: dict[str, Any]) -> redis.Redis:
    return redis.Redis.from_url(url, **options)


_ASYNC = _Flavour(_async_standalone, aioredis.RedisCluster, ClusterNode, Sentinel, _SentinelRedis)
_SYNC = _Flavour(
    _sync_standalone, redis.RedisCluster, SyncClusterNode, SyncSentinel, _SyncSentinelRedis
)


def _create(
    url: str,
    flavour: _Flavour,
    sentinel_kwargs: dict[str, Any] | None,
    connection_kwargs: dict[str, Any],
) -> Any:
    address = parse_address(url)
    if address.kind == "standalone":
        return flavour.standalone(url, connection_kwargs)
    options = _login(address, connection_kwargs)
    if address.kind == "cluster":
        options = _accepted(flavour.cluster.__init__, options)
        nodes = [flavour.node(host, port) for host, port in address.nodes]
        return flavour.cluster(startup_nodes=nodes, **options)
    sentinel = flavour.sentinel(
        list(address.nodes),
        sentinel_kwargs=sentinel_kwargs or _sentinel_kwargs(address, connection_kwargs),
    )
    client = sentinel.master_for(
        address.service_name, redis_class=flavour.sentinel_master, db=address.db, **options
    )
    client.owned_sentinel = sentinel
    return client


def create_client(
    url: str, *, sentinel_kwargs: dict[str, Any] | None = None, **connection_kwargs: Any
) -> AsyncClient:
    """An async client for ``url``: a ``Redis``, or a ``RedisCluster`` for a cluster URL.

    ``connection_kwargs`` (timeouts, ``max_connections``, ``decode_responses``, ...) go
    to every connection; for a cluster, ``max_connections`` is per node. For Sentinel,
    ``sentinel_kwargs`` are the connections to the sentinels (default: the socket
    options of ``connection_kwargs``). The client is not connected yet.
    """
    client: AsyncClient = _create(url, _ASYNC, sentinel_kwargs, connection_kwargs)
    return client


def create_sync_client(
    url: str, *, sentinel_kwargs: dict[str, Any] | None = None, **connection_kwargs: Any
) -> SyncClient:
    """The blocking twin of :func:`create_client`, for the CLI and threads."""
    client: SyncClient = _create(url, _SYNC, sentinel_kwargs, connection_kwargs)
    return client


def is_cluster(client: AsyncClient | SyncClient) -> bool:
    """Whether ``client`` talks to a Redis Cluster."""
    return isinstance(client, aioredis.RedisCluster | redis.RedisCluster)


# Options a cluster client hands its nodes' connections that only make sense inside it.
_CLUSTER_ONLY = frozenset(
    {
        "himport_registry",
        "maint_notifications_config",
        "oss_cluster_maint_notifications_handler",
        "redis_connect_func",
        "response_callbacks",
    }
)


@asynccontextmanager
async def slot_client(client: AsyncClient, key: str) -> AsyncIterator[aioredis.Redis]:
    """A client on the server that holds ``key``'s slot: ``client`` itself unless it is a
    cluster client, else a short-lived client of that node with the same options.

    For WATCH transactions: redis-py's async cluster client runs the commands between
    WATCH and MULTI on a thread with an event loop of its own, which fails on the
    connection of the caller's loop. A key's own node runs them like any server.
    """
    if not isinstance(client, aioredis.RedisCluster):
        yield client
        return
    await client.initialize()
    node = client.get_node_from_key(key)
    if node is None:  # the slot map was just loaded: only a cluster missing slots has none
        raise redis.exceptions.ClusterDownError(f"no node holds the slot of {key!r}")
    options = {k: v for k, v in node.connection_kwargs.items() if k not in _CLUSTER_ONLY}
    pool = aioredis.ConnectionPool(connection_class=node.connection_class, **options)
    direct = aioredis.Redis.from_pool(pool)
    try:
        yield direct
    finally:
        await direct.aclose()


async def server_time_ms(client: AsyncClient, key: str) -> int:
    """The server's clock in ms; on a cluster, the clock of the node holding ``key``'s slot,
    the one the scripts touching ``key`` read (a cluster client sends TIME to any node)."""
    route: dict[str, Any] = {}
    if isinstance(client, aioredis.RedisCluster):
        await client.initialize()
        route["target_nodes"] = client.get_node_from_key(key)
    seconds, micros = await client.time(**route)
    return int(seconds) * 1000 + int(micros) // 1000


def sync_server_time_ms(client: SyncClient, key: str) -> int:
    """The server's clock in ms; on a cluster, the clock of the node holding ``key``'s slot,
    the one the scripts touching ``key`` read (a cluster client sends TIME to any node)."""
    route: dict[str, Any] = {}
    if isinstance(client, redis.RedisCluster):
        route["target_nodes"] = _untyped(client.get_node_from_key)(key)
    reply: Any = client.time(**route)
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000
