"""Who is calling: a tenant (by its API key) or the operator (by the admin key).

``Authorization: Bearer <key>``. A tenant key names its tenant; the body never does.
The admin key (``--admin-key`` / ``FAIRLANE_GATEWAY_ADMIN_KEY``) may read any job
but submits, cancels and signals nothing: it has no tenant. Given the ``operate``
scope (``--admin-scopes read,operate``) it also pauses and resumes dispatch and
quarantines tenants, through the dashboard's API (``fairlane.gateway.ui.pausing``).

A tenant key does only what its scopes allow (``scoped(scope)``, ``submitter``): the
key is checked first (401: missing, not valid or expired), then its scope (403, reason
``scope``, ``OutOfScope``), and only then is anything about a job looked at.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from fairlane.gateway.apikeys import SCOPES, KeyExpired, parse_key
from fairlane.gateway.state import GatewayState
from fairlane.store.apikeys import KeyGuard, KeyOutOfScope, KeyRecord, KeyRefused

__all__ = [
    "Caller",
    "OutOfScope",
    "bearer",
    "bearer_key",
    "caller",
    "gateway_state",
    "is_admin_key",
    "refused_key",
    "scoped",
    "submitter",
]

#: the bearer credentials of a request (None when it has none)
bearer = HTTPBearer(auto_error=False, description="A tenant API key, or the admin key.")


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str | None  # None: the admin
    key_id: str | None
    #: a key vouched for from the record the gateway holds: the enqueue must check it
    guard: KeyGuard | None = None
    #: what the key may do (the admin key: what its endpoints let it)
    scopes: tuple[str, ...] = SCOPES

    @property
    def admin(self) -> bool:
        return self.tenant is None

    def require(self, scope: str) -> Caller:
        """This caller, if its key has ``scope``; else ``OutOfScope``."""
        if scope not in self.scopes:
            raise OutOfScope(scope)
        return self

    def may_read(self, owner: str | None) -> bool:
        return owner is not None and (self.admin or owner == self.tenant)

    def owns(self, owner: str | None) -> bool:
        return owner is not None and not self.admin and owner == self.tenant


class OutOfScope(Exception):
    """A valid key without the scope an endpoint needs: answered 403, reason ``scope``."""

    def __init__(self, scope: str) -> None:
        super().__init__(f"the API key lacks the {scope!r} scope this endpoint needs")
        self.scope = scope


def gateway_state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


_NO_KEY = "an API key is required: Authorization: Bearer <key>"
_NOT_VALID = "the API key is not valid (unknown, revoked or rotated)"
_EXPIRED = "the API key has expired"


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(401, message, headers={"WWW-Authenticate": "Bearer"})


async def caller(
    state: Annotated[GatewayState, Depends(gateway_state)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Caller:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise _unauthorized(_NO_KEY)
    return await _check(state, credentials.credentials)


def scoped(scope: str) -> Callable[..., Awaitable[Caller]]:
    """The dependency of an endpoint that needs ``scope``: the caller (``caller``),
    refused with ``OutOfScope`` unless its key has that scope."""
    if scope not in SCOPES:
        raise ValueError(f"no scope {scope!r}: one of {', '.join(SCOPES)}")

    async def scoped_caller(
        state: Annotated[GatewayState, Depends(gateway_state)],
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Caller:
        return (await caller(state, credentials)).require(scope)

    return scoped_caller


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header (read as ``bearer`` reads
    it), or None."""
    scheme, _, key = (authorization or "").partition(" ")
    key = key.strip()
    return key if key and scheme.lower() == "bearer" else None


async def submitter(state: GatewayState, authorization: str | None) -> Caller:
    """The caller of a submit, from its ``Authorization`` header (read as ``bearer``
    reads it). A key whose record the gateway holds is not looked up again when the
    enqueue can check it in the same step (``Caller.guard``): its tenant lives in the
    home shard, where the key records are, and the app waits for no durability. The
    record held must allow ``submit`` and not look expired (by this clock; the script
    holds it to the server's); else the key is looked up, and its scope checked."""
    key = bearer_key(authorization)
    if key is None:
        raise _unauthorized(_NO_KEY)
    keys = state.key_cache  # none yet: not connected, or no key checked so far
    if keys is not None and not is_admin_key(state, key):
        vouched = keys.vouched(key)
        if vouched is not None and _may_submit(state, vouched[1]):
            key_id, record = vouched
            guard = keys.records.guard(key_id, record)
            return Caller(record.tenant, key_id, guard, record.scopes)
    return (await _check(state, key)).require("submit")


def _may_submit(state: GatewayState, record: KeyRecord) -> bool:
    local_ms = int(time.time() * 1000)
    return (
        record.allows("submit")
        and not record.expired(local_ms)
        and state.enqueue_checks_keys(record.tenant)
    )


def refused_key(
    state: GatewayState, key_id: str | None, refusal: KeyRefused | None = None
) -> HTTPException | OutOfScope:
    """What to raise for a key the enqueue refused: 401 for one revoked, rotated or
    expired, ``OutOfScope`` (403) for one that may not submit."""
    if state.key_cache is not None and key_id is not None:
        state.key_cache.forget(key_id)
    if isinstance(refusal, KeyOutOfScope):
        return OutOfScope(refusal.scope)
    return _unauthorized(str(refusal) if refusal is not None and str(refusal) else _NOT_VALID)


def is_admin_key(state: GatewayState, key: str) -> bool:
    return bool(state.admin_key) and hmac.compare_digest(
        key.encode(), (state.admin_key or "").encode()
    )


async def _check(state: GatewayState, key: str) -> Caller:
    if is_admin_key(state, key):
        return Caller(tenant=None, key_id=None)
    # an ill-formed key is refused without a lookup (or a connection to the store)
    try:
        found = await (await state.keys()).identify(key) if parse_key(key) else None
    except KeyExpired:
        raise _unauthorized(_EXPIRED) from None
    if found is None:
        raise _unauthorized(_NOT_VALID)
    key_id, record = found
    return Caller(tenant=record.tenant, key_id=key_id, scopes=record.scopes)
