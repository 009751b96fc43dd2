"""The redis-py connection classes Fairlane's clients use: hiredis packing, resets seen.

``fast_connection_class`` maps redis-py's own connection classes to these; a client
made by ``fairlane.store.connection`` swaps them into its pool (``Store.from_url``).
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any, Final

import hiredis
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection


class HiredisPacking:
    """Packs commands with hiredis's C packer.

    redis-py's asyncio connections pack each command in Python, which costs more than
    the server takes to run a short script; hiredis does the same work in C.
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        first = args[0]
        if isinstance(first, str) and " " in first:  # e.g. "FUNCTION LOAD"
            args = (*first.split(), *args[1:])
        return [hiredis.pack_command(args)]


class ResetAware:
    """Reports a pooled connection the peer reset while it sat idle as unusable.

    The pool checks each connection it hands out (``can_read``) and reconnects one the
    server closed; redis-py sees a FIN there, but not a reset, which asyncio keeps as
    the stream's exception: without this the first call after it fails for nothing.
    """

    async def can_read(self) -> bool:
        reader: asyncio.StreamReader | None = getattr(self, "_reader", None)
        if reader is not None and reader.exception() is not None:
            return True
        parent: Any = super()
        return bool(await parent.can_read())


class _TcpConnection(ResetAware, HiredisPacking, Connection):
    pass


class _UnixConnection(ResetAware, HiredisPacking, UnixDomainSocketConnection):
    pass


class _TlsConnection(ResetAware, HiredisPacking, SSLConnection):
    pass


def _pool_checks() -> dict[str, Any]:
    """Options that keep the pool's check of idle connections on.

    With maintenance notifications on (redis-py's "auto"), the pool skips that check, so
    every pooled connection a restarted server closed would fail once before being
    reconnected. The asyncio clients, which these pools serve, take the option from
    redis-py 8.1 (with their own module of handlers); earlier ones refuse it, though the
    synchronous clients have had it since the 7th release.
    """
    try:
        importlib.import_module("redis.asyncio.maint_notifications")
    except ImportError:
        return {}
    notifications = importlib.import_module("redis.maint_notifications")
    return {"maint_notifications_config": notifications.MaintNotificationsConfig(enabled=False)}


POOL_CHECKS: Final = _pool_checks()

FAST_CONNECTIONS: dict[type[Any], type[Any]] = {
    Connection: _TcpConnection,
    UnixDomainSocketConnection: _UnixConnection,
    SSLConnection: _TlsConnection,
}
