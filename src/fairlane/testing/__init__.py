"""Helpers for testing code that uses Fairlane: private, throw-away Redis/Valkey servers.

This package owns :class:`RedisServer` (``fairlane.testing.server``), a server process
private to one test run: its own free TCP port on 127.0.0.1 and its own temporary
directory, restarted on the same port and directory (keeping its AOF data when
``appendonly`` is on) or killed with SIGKILL, for fault tests. It never touches the
shared per-user dev server of :mod:`fairlane.devserver`. Every wait is bounded.

It also owns :class:`RedisCluster` (``fairlane.testing.cluster``), a private Redis
Cluster of several such servers (slots assigned and nodes joined here, no cluster
CLI), and :class:`RedisSentinel` (``fairlane.testing.sentinel``), a Sentinel process
monitoring one of them; both start from the same server binary. What the three
processes share (ports, directories, logs, a bounded stop) is
``fairlane.testing.process``.

Example::

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
"""

from __future__ import annotations

from fairlane.devserver import ServerStartError
from fairlane.testing.cluster import RedisCluster
from fairlane.testing.sentinel import RedisSentinel
from fairlane.testing.server import RedisServer

__all__ = ["RedisCluster", "RedisSentinel", "RedisServer", "ServerStartError"]
