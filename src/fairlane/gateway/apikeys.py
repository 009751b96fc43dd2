"""Tenant API keys of the HTTP gateway: minting, rotating, revoking, checking.

A key reads ``flk_<key id>_<secret>``: the key id (12 hex characters) is public and
names the key in logs and on the command line; the secret is
``secrets.token_urlsafe(32)`` (256 random bits). Only a SHA-256 digest of the whole
key is stored, in the app's ``gw:keys`` hash (``AppKeys.gateway_keys``), field
``<key id>`` -> JSON ``{tenant, sha256, created_ms}``.

Why a plain SHA-256 and not a password hash (bcrypt, scrypt, argon2): those are slow
on purpose, to make guessing a *low-entropy* password from its hash expensive. A
256-bit random secret cannot be guessed whatever the hash costs, so a fast one-way
hash loses nothing and keeps authentication to one HGET and one digest per request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Any

import msgspec
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fairlane.store.connection import AsyncClient, slot_client
from fairlane.store.keys import AppKeys
from fairlane.store.wire import StoreUnavailable

__all__ = ["ApiKeys", "KeyNotFound", "KeyRecord", "MintedKey", "parse_key"]

KEY_PREFIX = "flk_"
_KEY_ID_HEX = 12
_MAX_KEY_LENGTH = 200


class KeyNotFound(LookupError):
    """No active key of that id (never created, or revoked)."""


class KeyRecord(msgspec.Struct, frozen=True):
    """A key as stored: whose it is and the digest of the full key; never the key."""

    tenant: str
    sha256: str
    created_ms: int


@dataclass(frozen=True, slots=True)
class MintedKey:
    """A key just created or rotated; ``key`` is shown once and never stored."""

    key_id: str
    tenant: str
    key: str


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(KeyRecord)


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_key(key: str) -> str | None:
    """The key id of a well-formed key, else None (nothing is looked up for it)."""
    if len(key) > _MAX_KEY_LENGTH or not key.startswith(KEY_PREFIX):
        return None
    key_id, sep, secret = key[len(KEY_PREFIX) :].partition("_")
    if not sep or not secret or len(key_id) != _KEY_ID_HEX:
        return None
    if any(c not in "0123456789abcdef" for c in key_id):
        return None
    return key_id


def _mint(key_id: str, tenant: str) -> tuple[MintedKey, KeyRecord]:
    key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    record = KeyRecord(tenant=tenant, sha256=_digest(key), created_ms=int(time.time() * 1000))
    return MintedKey(key_id, tenant, key), record


def check_tenant(tenant: str) -> str:
    if not tenant or len(tenant) > 200 or tenant != tenant.strip():
        raise ValueError(
            f"a tenant must be 1 to 200 characters without surrounding spaces: {tenant!r}"
        )
    return tenant


class ApiKeys:
    """The API keys of one app, in its ``gw:keys`` hash."""

    def __init__(self, client: AsyncClient, app_name: str, shards: int = 1) -> None:
        self.client = client
        # app-wide records live in the home shard (shard 0)
        self.hash = AppKeys.for_shard(app_name, 0, shards).gateway_keys

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise StoreUnavailable(f"the Redis server is unreachable: {exc}") from exc

    async def create(self, tenant: str) -> MintedKey:
        """A new key for ``tenant`` (a tenant may hold several, e.g. during a rollover)."""
        check_tenant(tenant)
        while True:
            minted, record = _mint(secrets.token_hex(_KEY_ID_HEX // 2), tenant)
            if await self._call(
                self.client.hsetnx, self.hash, minted.key_id, _ENCODER.encode(record)
            ):
                return minted

    async def rotate(self, key_id: str) -> MintedKey:
        """A new secret under the same key id; the old key stops working at once."""

        async def step(pipe: Any) -> MintedKey:
            raw = await pipe.hget(self.hash, key_id)
            if raw is None:
                raise KeyNotFound(f"no active API key {key_id!r}")
            minted, record = _mint(key_id, _DECODER.decode(raw).tenant)
            pipe.multi()
            pipe.hset(self.hash, key_id, _ENCODER.encode(record))
            return minted

        # WATCHed (redis-py retries on a conflict): a racing revoke is never undone by it
        async with slot_client(self.client, self.hash) as client:
            result: MintedKey = await self._call(
                client.transaction, step, self.hash, value_from_callable=True
            )
        return result

    async def revoke(self, key_id: str) -> KeyRecord:
        """Delete a key; requests bearing it are refused from now on."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hget(self.hash, key_id)
            pipe.hdel(self.hash, key_id)
            raw, _ = await self._call(pipe.execute)
        if raw is None:
            raise KeyNotFound(f"no active API key {key_id!r}")
        return _DECODER.decode(raw)

    async def list(self) -> dict[str, KeyRecord]:
        """Every active key id with its record, by key id."""
        raw = await self._call(self.client.hgetall, self.hash)
        out = {}
        for field, value in raw.items():
            name = field.decode() if isinstance(field, bytes) else str(field)
            out[name] = _DECODER.decode(value)
        return dict(sorted(out.items()))

    async def authenticate(self, key: str) -> tuple[str, str] | None:
        """(key id, tenant) of a valid key, else None."""
        key_id = parse_key(key)
        if key_id is None:
            return None
        raw = await self._call(self.client.hget, self.hash, key_id)
        if raw is None:
            return None
        record = _DECODER.decode(raw)
        if not hmac.compare_digest(record.sha256, _digest(key)):
            return None
        return key_id, record.tenant
