"""Tenant API keys of the HTTP gateway: minting, rotating, revoking, checking.

A key reads ``flk_<key id>_<secret>``: the key id (12 hex characters) is public and
names the key in logs and on the command line; the secret is
``secrets.token_urlsafe(32)`` (256 random bits). Only a SHA-256 digest of the whole
key is stored, with the tenant it belongs to, when it was made, its scopes and its
expiry, in the app's key records (``fairlane.store.apikeys``).

A key may be narrower than its tenant: its scopes are a subset of ``SCOPES``
(``submit``, ``read``, ``cancel``, ``signal``; every one unless told), and it may expire
(``expires``, a duration from now, kept as the server's time in ms). An expired key is
refused like a revoked one; its record stays until it is revoked.

The gateway's admin key is no record: it is given to the gateway, and its scopes are
``ADMIN_SCOPES``' ``read`` (every tenant's jobs, the dashboard) and, when the gateway is
told so, ``operate`` (pause and resume dispatch, quarantine tenants). ``operate`` is an
admin key's scope only: no tenant key may hold it. The admin key is named in the audit
trail by ``admin_key_id``, never by itself.

Why a plain SHA-256 and not a password hash (bcrypt, scrypt, argon2): those are slow
on purpose, to make guessing a *low-entropy* password from its hash expensive. A
256-bit random secret cannot be guessed whatever the hash costs, so a fast one-way
hash loses nothing and keeps authentication to one read (the record, pipelined with the
server's clock for its expiry) and one digest per request.

A submit costs not even the read: the gateway keeps the records it has read (up to
``KNOWN_KEYS``), checks the digest against the one it holds, and has the enqueue
script check the record in the same step as the enqueue (``KeyGuard``), so a key
revoked, rotated, narrowed or expired elsewhere a moment ago still stores nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from msgspec.structs import replace

from fairlane.store.apikeys import SCOPES, KeyRecord, KeyRecords

__all__ = [
    "ADMIN_SCOPES",
    "OPERATE",
    "SCOPES",
    "ApiKeys",
    "KeyExpired",
    "KeyNotFound",
    "KeyRecord",
    "MintedKey",
    "admin_key_id",
    "check_admin_scopes",
    "check_expires",
    "check_scopes",
    "parse_key",
]

KEY_PREFIX = "flk_"
_KEY_ID_HEX = 12
_MAX_KEY_LENGTH = 200
#: prefix, key id (lowercase hex), "_", a secret of at least one character
_WELL_FORMED = re.compile(rf"{KEY_PREFIX}([0-9a-f]{{{_KEY_ID_HEX}}})_(.+)", re.DOTALL)
#: the key records a gateway keeps, at most (the oldest read goes first)
KNOWN_KEYS = 10_000
#: the admin key's scope that pauses and resumes dispatch and quarantines tenants
OPERATE = "operate"
#: what an admin key may be given: it always reads; ``operate`` only when told
ADMIN_SCOPES: tuple[str, ...] = ("read", OPERATE)
#: rounds of the derivation of the admin key's public id (``admin_key_id``)
_ADMIN_ID_ROUNDS = 100_000


class KeyNotFound(LookupError):
    """No active key of that id (never created, or revoked)."""


class KeyExpired(LookupError):
    """A valid key past its expiry (by the server's clock): refused like a revoked one."""


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
    if len(key) > _MAX_KEY_LENGTH:
        return None
    well_formed = _WELL_FORMED.fullmatch(key)
    return None if well_formed is None else well_formed[1]


def _mint(key_id: str, like: KeyRecord) -> tuple[MintedKey, KeyRecord]:
    """A new key and its record: ``like``'s tenant, times and scopes, a new digest."""
    key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    return MintedKey(key_id, like.tenant, key), replace(like, sha256=_digest(key))


def check_scopes(scopes: Iterable[str]) -> tuple[str, ...]:
    """Scopes as a record keeps them (in ``SCOPES``' order), or ``ValueError``."""
    if isinstance(scopes, str):
        raise ValueError(f"scopes are a collection of names, not one string: {scopes!r}")
    wanted = set(scopes)
    unknown = sorted(wanted - set(SCOPES))
    if OPERATE in unknown:
        raise ValueError(f"{OPERATE!r} is the admin key's scope: no tenant key may hold it")
    if unknown:
        raise ValueError(f"unknown scope(s) {', '.join(unknown)}: use {', '.join(SCOPES)}")
    if not wanted:
        raise ValueError(f"a key needs at least one scope of {', '.join(SCOPES)}")
    kept = tuple(scope for scope in SCOPES if scope in wanted)
    return SCOPES if kept == SCOPES else kept  # the default itself: a record omits it


def check_admin_scopes(scopes: Iterable[str]) -> tuple[str, ...]:
    """The admin key's scopes (in ``ADMIN_SCOPES``' order), or ``ValueError``: a subset of
    ``ADMIN_SCOPES`` holding ``read``."""
    if isinstance(scopes, str):
        raise ValueError(f"scopes are a collection of names, not one string: {scopes!r}")
    wanted = set(scopes)
    unknown = sorted(wanted - set(ADMIN_SCOPES))
    if unknown:
        raise ValueError(
            f"unknown admin scope(s) {', '.join(unknown)}: use {', '.join(ADMIN_SCOPES)}"
        )
    if "read" not in wanted:
        raise ValueError("the admin key always reads: its scopes include 'read'")
    return tuple(scope for scope in ADMIN_SCOPES if scope in wanted)


def admin_key_id(admin_key: str) -> str:
    """The admin key's public name, ``admin:<12 hex>``, for the audit trail. Derived
    slowly (PBKDF2), as an admin key may be a phrase a person chose: its id, which
    admins read, must not make it cheap to guess."""
    digest = hashlib.pbkdf2_hmac(
        "sha256", admin_key.encode(), b"fairlane-admin-key-id", _ADMIN_ID_ROUNDS
    )
    return f"admin:{digest.hex()[:_KEY_ID_HEX]}"


def check_expires(expires: timedelta | None) -> timedelta | None:
    """A key's lifetime from now (None: it never expires), or ``ValueError``."""
    if expires is not None and (not isinstance(expires, timedelta) or expires <= timedelta(0)):
        raise ValueError(f"expires is a positive timedelta (from now), not {expires!r}")
    return expires


def _expiry_ms(expires: timedelta, now_ms: int) -> int:
    return now_ms + math.ceil(expires.total_seconds() * 1000)


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

    async def create(
        self,
        tenant: str,
        *,
        scopes: Iterable[str] = SCOPES,
        expires: timedelta | None = None,
    ) -> MintedKey:
        """A new key for ``tenant`` (a tenant may hold several, e.g. during a rollover),
        allowed ``scopes`` (all by default) and refused from ``expires`` from now on
        (by the server's clock; None: never)."""
        check_tenant(tenant)
        kept = check_scopes(scopes)
        lifetime = check_expires(expires)
        now = await self.records.server_ms()
        until = None if lifetime is None else _expiry_ms(lifetime, now)
        like = KeyRecord(tenant, "", now, kept, until)
        while True:
            minted, record = _mint(secrets.token_hex(_KEY_ID_HEX // 2), like)
            if await self.records.add(minted.key_id, record):
                return minted

    async def rotate(
        self,
        key_id: str,
        *,
        scopes: Iterable[str] | None = None,
        expires: timedelta | None = None,
    ) -> MintedKey:
        """A new secret under the same key id; the old key stops working at once. The
        key keeps its scopes and expiry unless new ones are given (``expires`` from now);
        an expired key needs a new expiry (``ValueError``), lest its new secret be dead."""
        change, now = await self._changes(scopes, expires)

        def renewed(old: KeyRecord) -> tuple[MintedKey, KeyRecord]:
            if expires is None and old.expired(now):
                raise ValueError(f"the API key {key_id} has expired: rotate it with a new expiry")
            return _mint(key_id, replace(old, created_ms=now, **change))

        minted = await self.records.replace(key_id, renewed)
        self.forget(key_id)
        if minted is None:
            raise KeyNotFound(f"no active API key {key_id!r}")
        return minted

    async def update(
        self,
        key_id: str,
        *,
        scopes: Iterable[str] | None = None,
        expires: timedelta | None = None,
    ) -> KeyRecord:
        """Give a key new scopes or a new expiry (from now), keeping its secret; its
        requests obey them at once, a submit vouched for from an older record too."""
        if scopes is None and expires is None:
            raise ValueError("nothing to update: give scopes or expires")
        change, _ = await self._changes(scopes, expires)

        def updated(old: KeyRecord) -> tuple[KeyRecord, KeyRecord]:
            new = replace(old, **change)
            return new, new

        record = await self.records.replace(key_id, updated, action="key_updated")
        self.forget(key_id)
        if record is None:
            raise KeyNotFound(f"no active API key {key_id!r}")
        return record

    async def _changes(
        self, scopes: Iterable[str] | None, expires: timedelta | None
    ) -> tuple[dict[str, object], int]:
        """The fields a rotation or update sets, checked before anything is written,
        and the server's clock (ms) the expiry is counted from."""
        change: dict[str, object] = {}
        if scopes is not None:
            change["scopes"] = check_scopes(scopes)
        lifetime = check_expires(expires)
        now = await self.records.server_ms()
        if lifetime is not None:
            change["expires_ms"] = _expiry_ms(lifetime, now)
        return change, now

    async def revoke(self, key_id: str) -> KeyRecord:
        """Delete a key; requests bearing it are refused from now on."""
        record = await self.records.remove(key_id)
        self.forget(key_id)
        if record is None:
            raise KeyNotFound(f"no active API key {key_id!r}")
        return record

    async def list(self) -> dict[str, KeyRecord]:
        """Every key id with its record, by key id (expired ones too, until revoked)."""
        return await self.records.all()

    async def authenticate(self, key: str) -> tuple[str, str] | None:
        """(key id, tenant) of a valid key that has not expired, else None."""
        try:
            found = await self.identify(key)
        except KeyExpired:
            return None
        return None if found is None else (found[0], found[1].tenant)

    async def identify(self, key: str) -> tuple[str, KeyRecord] | None:
        """(key id, record) of a valid key, None for a key that is not valid, and
        ``KeyExpired`` for one past its expiry by the server's clock."""
        key_id = parse_key(key)
        if key_id is None:
            return None
        record, now = await self.records.get_at(key_id)
        if record is None or not hmac.compare_digest(record.sha256, _digest(key)):
            self.forget(key_id)
            return None
        if record.expired(now):
            self.forget(key_id)
            raise KeyExpired(f"the API key {key_id} has expired")
        self._keep(key_id, record)
        return key_id, record

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
        """Drop a record kept for ``vouched`` (changed here, or refused by the store)."""
        self._known.pop(key_id, None)

    def _keep(self, key_id: str, record: KeyRecord) -> None:
        known = self._known
        known.pop(key_id, None)
        if len(known) >= KNOWN_KEYS:
            del known[next(iter(known))]
        known[key_id] = record
