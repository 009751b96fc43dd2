"""``RedisCluster``: a private Redis Cluster of several ``RedisServer`` primaries.

The slots are assigned and the nodes joined by this module (``CLUSTER ADDSLOTSRANGE``,
``CLUSTER MEET``), so no cluster CLI is needed; every node runs from the same server
binary as ``RedisServer``, with its own port, cluster-bus port and directory.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Self

import redis

from fairlane.devserver import ServerStartError
from fairlane.store.connection import cluster_url
from fairlane.testing.process import Managed, command, free_port
from fairlane.testing.server import RedisServer

__all__ = ["RedisCluster"]


_CLUSTER_SLOTS = 16384
_NODE_ATTEMPTS = 5


def _cluster_info(client: redis.Redis) -> dict[str, str]:
    text = command(client, "CLUSTER", "INFO")
    raw = text.decode() if isinstance(text, bytes) else str(text)
    return dict(line.split(":", 1) for line in raw.split() if ":" in line)


class RedisCluster(Managed):
    """A private Redis Cluster of ``masters`` primaries, each with ``replicas`` replicas
    (none by default), for tests.

    Each primary is a :class:`RedisServer` of the same binary, with ``cluster-enabled yes``
    on its own port, cluster-bus port and directory. The slots are split evenly with
    ``CLUSTER ADDSLOTSRANGE`` and the nodes joined with ``CLUSTER MEET``, so no cluster CLI
    is needed; :meth:`start` returns once every node reports ``cluster_state:ok`` and
    knows every other. ``url`` is a ``redis+cluster://`` URL naming all the nodes.

    With replicas, each replica follows its primary (``CLUSTER REPLICATE``) and
    :meth:`start` also waits for every replica's link; killing a primary
    (``servers[i].kill()``) then promotes its replica after ``node_timeout_ms``.
    """

    def __init__(
        self,
        binary: str | None = None,
        *,
        masters: int = 3,
        replicas: int = 0,
        extra_args: Sequence[str] = (),
        start_timeout: float = 30.0,
        node_timeout_ms: int = 5000,
    ) -> None:
        if masters < 1:
            raise ValueError("a cluster needs at least one master")
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        self._replicas = replicas
        self._followers: list[RedisServer] = []
        self._binary_name = binary
        self._masters = masters
        self._extra_args = tuple(extra_args)
        self._start_timeout = start_timeout
        self._node_timeout_ms = node_timeout_ms
        self._servers: list[RedisServer] = []
        self._bus_ports: list[int] = []

    @property
    def servers(self) -> list[RedisServer]:
        """The primaries, in slot order (the first holds slot 0)."""
        if not self._servers:
            raise RuntimeError("RedisCluster has not been started")
        return list(self._servers)

    @property
    def followers(self) -> list[RedisServer]:
        """The replicas: ``replicas`` per primary, in the primaries' order."""
        return list(self._followers)

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every primary."""
        return [(s.host, s.port) for s in self.servers]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,.../`` (``fairlane.store.connection``)."""
        return cluster_url(self.startup_nodes)

    def start(self) -> Self:
        if self._servers:
            raise RuntimeError("RedisCluster is already running")
        deadline = time.monotonic() + self._start_timeout
        try:
            for _ in range(self._masters * (1 + self._replicas)):
                self._start_node(deadline)
            self._servers, self._followers = (
                self._servers[: self._masters],
                self._servers[self._masters :],
            )
            self._form(deadline)
            if self._followers:
                self._follow(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node and delete their directories."""
        servers, self._servers, self._bus_ports = self._servers + self._followers, [], []
        self._followers = []
        for server in servers:
            server.stop()

    def __repr__(self) -> str:
        ports = ",".join(str(s.port) for s in self._servers)
        return f"<RedisCluster {'ports ' + ports if ports else 'stopped'}>"

    def _start_node(self, deadline: float) -> None:
        # The bus port is picked before the server binds it, so a collision is possible;
        # a node that fails to start is retried on fresh ports.
        for attempt in range(1, _NODE_ATTEMPTS + 1):
            bus = free_port()
            args = [
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-port", str(bus),
                "--cluster-node-timeout", str(self._node_timeout_ms),
                *self._extra_args,
            ]  # fmt: skip
            server = RedisServer(
                self._binary_name,
                extra_args=args,
                start_timeout=max(1.0, deadline - time.monotonic()),
            )
            try:
                server.start()
            except ServerStartError:
                if attempt == _NODE_ATTEMPTS or time.monotonic() >= deadline:
                    raise
                continue
            self._servers.append(server)
            self._bus_ports.append(bus)
            return

    def _form(self, deadline: float) -> None:
        nodes = self._servers + self._followers
        clients = [redis.Redis(host=s.host, port=s.port, socket_timeout=5.0) for s in nodes]
        try:
            n = self._masters
            for i, client in enumerate(clients[:n]):
                first, last = i * _CLUSTER_SLOTS // n, (i + 1) * _CLUSTER_SLOTS // n - 1
                command(client, "CLUSTER", "ADDSLOTSRANGE", first, last)
                # distinct epochs spare the nodes a round of collision handling
                command(client, "CLUSTER", "SET-CONFIG-EPOCH", i + 1)
            for server, bus in zip(nodes[1:], self._bus_ports[1:], strict=True):
                command(clients[0], "CLUSTER", "MEET", server.host, server.port, bus)
            self._wait_formed(clients, deadline)
        finally:
            for client in clients:
                client.close()

    def _wait_formed(self, clients: list[redis.Redis], deadline: float) -> None:
        delay = 0.02
        while True:
            infos = [_cluster_info(c) for c in clients]
            if all(
                info.get("cluster_state") == "ok"
                and info.get("cluster_known_nodes") == str(len(clients))
                and info.get("cluster_slots_ok") == str(_CLUSTER_SLOTS)
                for info in infos
            ):
                return
            if time.monotonic() >= deadline:
                raise ServerStartError(f"the cluster did not form in time: {infos}")
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def _follow(self, deadline: float) -> None:
        """Each replica follows its primary; returns once every link is up."""
        primaries = [
            redis.Redis(host=s.host, port=s.port, socket_timeout=5.0) for s in self._servers
        ]
        followers = [
            redis.Redis(host=s.host, port=s.port, socket_timeout=5.0) for s in self._followers
        ]
        try:
            ids = [command(c, "CLUSTER", "MYID") for c in primaries]
            for i, client in enumerate(followers):
                master = ids[i // self._replicas]
                command(
                    client,
                    "CLUSTER",
                    "REPLICATE",
                    master.decode() if isinstance(master, bytes) else master,
                )
            delay = 0.02
            while True:
                links = [
                    client.info("replication").get("master_link_status") for client in followers
                ]
                if all(link == "up" for link in links):
                    return
                if time.monotonic() >= deadline:
                    raise ServerStartError(f"the replicas did not follow in time: {links}")
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
        finally:
            for client in primaries + followers:
                client.close()
