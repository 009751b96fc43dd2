"""The HTTP gateway's API key records: the app's ``gw:keys`` hash.

Field ``<key id>`` -> JSON ``{tenant, sha256, created_ms, scopes?, expires_ms?}``
(``AppKeys.gateway_keys``), in the app's home shard (shard 0), where app-wide records
live. ``scopes`` (what the key may do, a subset of ``SCOPES``) and ``expires_ms`` (when
it stops working, by the server's clock) are left out when they are the defaults (every
scope, no expiry), so a record written before keys had them reads as it always meant. The gateway
(``fairlane.gateway.apikeys``) mints, checks and rotates keys; this module only keeps
their records: it never sees a key, only the digest the gateway computed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
import redis.asyncio as aioredis

from fairlane.store.base import unavailable
from fairlane.store.connection import AsyncClient, slot_client
from fairlane.store.fields import field_text
from fairlane.store.keys import AppKeys

__all__ = ["SCOPES", "KeyGuard", "KeyOutOfScope", "KeyRecord", "KeyRecords", "KeyRefused"]

T = TypeVar("T")

#: what a key may do: submit jobs, read jobs and results, cancel jobs, signal runs
SCOPES: tuple[str, ...] = ("submit", "read", "cancel", "signal")


class KeyRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """A key as stored: whose it is, the digest of the full key (never the key), what
    it may do and until when."""

    tenant: str
    sha256: str
    created_ms: int
    scopes: tuple[str, ...] = SCOPES
    #: server time (ms) from which the key is refused; None: never
    expires_ms: int | None = None

    def allows(self, scope: str) -> bool:
        return scope in self.scopes

    def expired(self, now_ms: int) -> bool:
        return self.expires_ms is not None and now_ms >= self.expires_ms


class KeyRefused(Exception):
    """The enqueue script found the caller's key gone, changed or expired: nothing was
    stored. The message says which, for the caller."""


class KeyOutOfScope(KeyRefused):
    """The enqueue script found the caller's key without the ``submit`` scope: nothing
    was stored."""

    scope = "submit"


#: the error the enqueue script (``enqueue_as``) answers for a key it refuses
KEY_REFUSED_ERROR = "NOKEY"
#: ... and for a key whose scopes do not include ``submit``
KEY_SCOPE_ERROR = "NOSCOPE"


class KeyGuard(msgspec.Struct, frozen=True):
    """A caller's key, checked by the enqueue script in the same step as the enqueue:
    its records hash, id, digest and tenant (``Submission.submit(guard=...)``)."""

    records: str
    key_id: str
    sha256: str
    tenant: str


class _Missing(Exception):
    """No record of the key id a transaction read."""


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(KeyRecord)


class KeyRecords:
    """The API key records of one app."""

    def __init__(self, client: AsyncClient, app_name: str, shards: int = 1) -> None:
        self.client = client
        self.hash = AppKeys.for_shard(app_name, 0, shards).gateway_keys

    def guard(self, key_id: str, record: KeyRecord) -> KeyGuard:
        """The check of ``record`` (as the caller holds it) that an enqueue makes."""
        return KeyGuard(self.hash, key_id, record.sha256, record.tenant)

    async def add(self, key_id: str, record: KeyRecord) -> bool:
        """Store ``record`` under ``key_id`` unless that id is taken; whether it was stored."""
        with unavailable():
            return bool(await self.client.hsetnx(self.hash, key_id, _ENCODER.encode(record)))

    async def get(self, key_id: str) -> KeyRecord | None:
        with unavailable():
            raw = await self.client.hget(self.hash, key_id)
        return None if raw is None else _DECODER.decode(raw)

    async def get_at(self, key_id: str) -> tuple[KeyRecord | None, int]:
        """The record of ``key_id`` (None: none) and the server's clock in ms, read
        together: the clock an expiry is held against, as the enqueue script holds it."""
        with unavailable():
            if isinstance(self.client, aioredis.RedisCluster):
                raw, now = await asyncio.gather(
                    self.client.hget(self.hash, key_id), self.server_ms()
                )
            else:
                async with self.client.pipeline(transaction=False) as pipe:
                    pipe.hget(self.hash, key_id)
                    pipe.time()
                    raw, (seconds, micros) = await pipe.execute()
                now = int(seconds) * 1000 + int(micros) // 1000
        return None if raw is None else _DECODER.decode(raw), now

    async def server_ms(self) -> int:
        """The server's clock in ms; on a cluster, that of the node holding the records
        (a cluster client sends TIME to any node unless told which)."""
        route: dict[str, Any] = {}
        with unavailable():
            if isinstance(self.client, aioredis.RedisCluster):
                await self.client.initialize()
                route["target_nodes"] = self.client.get_node_from_key(self.hash)
            seconds, micros = await self.client.time(**route)
        return int(seconds) * 1000 + int(micros) // 1000

    async def replace(
        self, key_id: str, change: Callable[[KeyRecord], tuple[T, KeyRecord]]
    ) -> T | None:
        """Replace the record of ``key_id`` by what ``change`` makes of it, as one
        atomic step (WATCHed: redis-py runs it again on a conflict, so a racing removal
        is never undone); what ``change`` returned, None when there is no such key."""

        async def step(pipe: Any) -> T:
            raw = await pipe.hget(self.hash, key_id)
            if raw is None:
                raise _Missing  # the transaction is abandoned: nothing is written
            answer, record = change(_DECODER.decode(raw))
            pipe.multi()
            pipe.hset(self.hash, key_id, _ENCODER.encode(record))
            return answer

        try:
            with unavailable():
                async with slot_client(self.client, self.hash) as client:
                    result: T = await client.transaction(step, self.hash, value_from_callable=True)
        except _Missing:
            return None
        return result

    async def remove(self, key_id: str) -> KeyRecord | None:
        """Delete the record of ``key_id``; it as it was, None when there was none."""
        with unavailable():
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.hget(self.hash, key_id)
                pipe.hdel(self.hash, key_id)
                raw, _ = await pipe.execute()
        return None if raw is None else _DECODER.decode(raw)

    async def all(self) -> dict[str, KeyRecord]:
        """Every record, by key id."""
        with unavailable():
            raw = await self.client.hgetall(self.hash)
        return dict(sorted((field_text(k), _DECODER.decode(v)) for k, v in raw.items()))
