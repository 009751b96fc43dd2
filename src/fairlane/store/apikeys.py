"""The HTTP gateway's API key records: the app's ``gw:keys`` hash.

Field ``<key id>`` -> JSON ``{tenant, sha256, created_ms, scopes?, expires_ms?}``
(``AppKeys.gateway_keys``), in the app's home shard (shard 0), where app-wide records
live. ``scopes`` (what the key may do, a subset of ``SCOPES``) and ``expires_ms`` (when
it stops working, by the server's clock) are left out when they are the defaults (every
scope, no expiry), so a record written before keys had them reads as it always meant.
The gateway (``fairlane.gateway.apikeys``) mints, checks and rotates keys; this module only keeps
their records: it never sees a key, only the digest the gateway computed. Each change
of a record writes its entry in the app's audit trail (``fairlane.store.audit``) in the
same transaction: a record is never changed without its entry, nor the other way round.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
import redis.asyncio as aioredis

from fairlane.store.audit import DEFAULT_ENTRIES, AuditTrail
from fairlane.store.base import unavailable
from fairlane.store.connection import AsyncClient, server_time_ms, slot_client
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
    its records hash, id, digest and tenant (``Submission.submit(guard=...)``), and the
    audit trail (stream and cap) the same step records the submit in."""

    records: str
    key_id: str
    sha256: str
    tenant: str
    audit: str
    audit_cap: int


class _Missing(Exception):
    """No record of the key id a transaction read."""


class _Taken(Exception):
    """The key id a transaction would add has a record already."""


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(KeyRecord)


class KeyRecords:
    """The API key records of one app."""

    def __init__(
        self,
        client: AsyncClient,
        app_name: str,
        shards: int = 1,
        audit_entries: int = DEFAULT_ENTRIES,
    ) -> None:
        self.client = client
        self.hash = AppKeys.for_shard(app_name, 0, shards).gateway_keys
        #: the app's audit trail, beside the records (same shard, same slot)
        self.audit = AuditTrail(client, app_name, shards, audit_entries)

    def guard(self, key_id: str, record: KeyRecord) -> KeyGuard:
        """The check of ``record`` (as the caller holds it) that an enqueue makes."""
        audit = self.audit
        return KeyGuard(self.hash, key_id, record.sha256, record.tenant, audit.stream, audit.cap)

    async def _transaction(self, step: Callable[[Any], Awaitable[T]]) -> T:
        """``step`` as one WATCHed transaction on the records (run again on a conflict)."""
        with unavailable():
            async with slot_client(self.client, self.hash) as client:
                result: T = await client.transaction(step, self.hash, value_from_callable=True)
        return result

    async def add(self, key_id: str, record: KeyRecord) -> bool:
        """Store ``record`` under ``key_id`` unless that id is taken, with its
        ``key_created`` entry; whether it was stored."""

        async def step(pipe: Any) -> bool:
            if await pipe.hexists(self.hash, key_id):
                raise _Taken  # the transaction is abandoned: nothing is written
            pipe.multi()
            pipe.hset(self.hash, key_id, _ENCODER.encode(record))
            self.audit.add(pipe, "key_created", key_id, record.tenant, "ok")
            return True

        try:
            return await self._transaction(step)
        except _Taken:
            return False

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
        with unavailable():
            return await server_time_ms(self.client, self.hash)

    async def replace(
        self,
        key_id: str,
        change: Callable[[KeyRecord], tuple[T, KeyRecord]],
        action: str = "key_rotated",
    ) -> T | None:
        """Replace the record of ``key_id`` by what ``change`` makes of it, with its
        ``action`` entry in the audit trail, as one atomic step (WATCHed: redis-py runs
        it again on a conflict, so a racing removal is never undone); what ``change``
        returned, None when there is no such key."""

        async def step(pipe: Any) -> T:
            raw = await pipe.hget(self.hash, key_id)
            if raw is None:
                raise _Missing  # the transaction is abandoned: nothing is written
            answer, record = change(_DECODER.decode(raw))
            pipe.multi()
            pipe.hset(self.hash, key_id, _ENCODER.encode(record))
            self.audit.add(pipe, action, key_id, record.tenant, "ok")
            return answer

        try:
            return await self._transaction(step)
        except _Missing:
            return None

    async def remove(self, key_id: str) -> KeyRecord | None:
        """Delete the record of ``key_id``, with its ``key_revoked`` entry; it as it
        was, None when there was none."""

        async def step(pipe: Any) -> KeyRecord:
            raw = await pipe.hget(self.hash, key_id)
            if raw is None:
                raise _Missing
            record = _DECODER.decode(raw)
            pipe.multi()
            pipe.hdel(self.hash, key_id)
            self.audit.add(pipe, "key_revoked", key_id, record.tenant, "ok")
            return record

        try:
            return await self._transaction(step)
        except _Missing:
            return None

    async def all(self) -> dict[str, KeyRecord]:
        """Every record, by key id."""
        with unavailable():
            raw = await self.client.hgetall(self.hash)
        return dict(sorted((field_text(k), _DECODER.decode(v)) for k, v in raw.items()))
