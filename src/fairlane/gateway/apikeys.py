"""Tenant API keys of the HTTP gateway: minting, rotating, revoking, checking.

A key reads ``flk_<key id>_<secret>``: the key id (12 hex characters) is public and
names the key in logs and on the command line; the secret is
``secrets.token_urlsafe(32)`` (256 random bits). Only a SHA-256 digest of the whole
key is stored, with the tenant it belongs to and when it was made, in the app's key
records (``fairlane.store.apikeys``).

Why a plain SHA-256 and not a password hash (bcrypt, scrypt, argon2): those are slow
on purpose, to make guessing a *low-entropy* password from its hash expensive. A
256-bit random secret cannot be guessed whatever the hash costs, so a fast one-way
hash loses nothing and keeps authentication to one HGET and one digest per request.

A submit costs not even the HGET: the gateway keeps the records it has read (up to
``KNOWN_KEYS``), checks the digest against the one it holds, and has the enqueue
script check the record in the same step as the enqueue (``KeyGuard``), so a key
revoked or rotated elsewhere a moment ago still stores nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from fairlane.store.apikeys import KeyRecord, KeyRecords

__all__ = ["ApiKeys", "KeyNotFound", "KeyRecord", "MintedKey", "parse_key"]

KEY_PREFIX = "flk_"
_KEY_ID_HEX = 12
_MAX_KEY_LENGTH = 200
#: the key records a gateway keeps, at most (the oldest read goes first)
KNOWN_KEYS = 10_000


class KeyNotFound(LookupError):
    """No active key of that id (never created, or revoked)."""


@dataclass(frozen=True, slots=True)
class MintedKey:
    """A key just created or rotated; ``key`` is shown once and never stored."""

    key_id: str
    tenant: str
    key: str


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
    """The API keys of one app, kept as the store's key records."""

    def __init__(self, records: KeyRecords) -> None:
        self.records = records
        self._known: dict[str, KeyRecord] = {}

    async def create(self, tenant: str) -> MintedKey:
        """A new key for ``tenant`` (a tenant may hold several, e.g. during a rollover)."""
        check_tenant(tenant)
        while True:
            minted, record = _mint(secrets.token_hex(_KEY_ID_HEX // 2), tenant)
            if await self.records.add(minted.key_id, record):
                return minted

    async def rotate(self, key_id: str) -> MintedKey:
        """A new secret under the same key id; the old key stops working at once."""
        minted = await self.records.replace(key_id, lambda old: _mint(key_id, old.tenant))
        self._known.pop(key_id, None)
        if minted is None:
            raise KeyNotFound(f"no active API key {key_id!r}")
        return minted

    async def revoke(self, key_id: str) -> KeyRecord:
        """Delete a key; requests bearing it are refused from now on."""
        record = await self.records.remove(key_id)
        self._known.pop(key_id, None)
        if record is None:
            raise KeyNotFound(f"no active API key {key_id!r}")
        return record

    async def list(self) -> dict[str, KeyRecord]:
        """Every active key id with its record, by key id."""
        return await self.records.all()

    async def authenticate(self, key: str) -> tuple[str, str] | None:
        """(key id, tenant) of a valid key, else None."""
        key_id = parse_key(key)
        if key_id is None:
            return None
        record = await self.records.get(key_id)
        if record is None or not hmac.compare_digest(record.sha256, _digest(key)):
            self._known.pop(key_id, None)
            return None
        self._keep(key_id, record)
        return key_id, record.tenant

    def vouched(self, key: str) -> tuple[str, KeyRecord] | None:
        """(key id, record) of a key whose record this gateway has read and whose
        digest matches it, without a lookup: the record as last read, which only a
        guarded enqueue (``KeyRecords.guard``) may trust. None: ``authenticate`` it."""
        key_id = parse_key(key)
        record = self._known.get(key_id) if key_id is not None else None
        if key_id is None or record is None:
            return None
        if not hmac.compare_digest(record.sha256, _digest(key)):
            return None
        return key_id, record

    def forget(self, key_id: str) -> None:
        """Drop a record kept for ``vouched`` (the store refused the key)."""
        self._known.pop(key_id, None)

    def _keep(self, key_id: str, record: KeyRecord) -> None:
        known = self._known
        known.pop(key_id, None)
        if len(known) >= KNOWN_KEYS:
            del known[next(iter(known))]
        known[key_id] = record
