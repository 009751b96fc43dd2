"""Who is calling: a tenant (by its API key) or the operator (by the admin key).

``Authorization: Bearer <key>``. A tenant key names its tenant; the body never does.
The admin key (``--admin-key`` / ``FAIRLANE_GATEWAY_ADMIN_KEY``) may read any job
but submits, cancels and signals nothing: it has no tenant.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from fairlane.gateway.apikeys import parse_key
from fairlane.gateway.state import GatewayState
from fairlane.store.apikeys import KeyGuard

__all__ = ["Caller", "bearer", "caller", "gateway_state", "refused_key", "submitter"]

#: the bearer credentials of a request (None when it has none)
bearer = HTTPBearer(auto_error=False, description="A tenant API key, or the admin key.")


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str | None  # None: the admin
    key_id: str | None
    #: a key vouched for from the record the gateway holds: the enqueue must check it
    guard: KeyGuard | None = None

    @property
    def admin(self) -> bool:
        return self.tenant is None

    def may_read(self, owner: str | None) -> bool:
        return owner is not None and (self.admin or owner == self.tenant)

    def owns(self, owner: str | None) -> bool:
        return owner is not None and not self.admin and owner == self.tenant


def gateway_state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


_NO_KEY = "an API key is required: Authorization: Bearer <key>"
_NOT_VALID = "the API key is not valid (unknown, revoked or rotated)"


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(401, message, headers={"WWW-Authenticate": "Bearer"})


async def caller(
    state: Annotated[GatewayState, Depends(gateway_state)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Caller:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise _unauthorized(_NO_KEY)
    return await _check(state, credentials.credentials)


async def submitter(state: GatewayState, authorization: str | None) -> Caller:
    """The caller of a submit, from its ``Authorization`` header (read as ``bearer``
    reads it). A key whose record the gateway holds is not looked up again when the
    enqueue can check it in the same step (``Caller.guard``): its tenant lives in the
    home shard, where the key records are, and the app waits for no durability."""
    scheme, _, key = (authorization or "").partition(" ")
    key = key.strip()
    if not key or scheme.lower() != "bearer":
        raise _unauthorized(_NO_KEY)
    keys = state.key_cache  # none yet: not connected, or no key checked so far
    if keys is not None and not _is_admin(state, key):
        vouched = keys.vouched(key)
        if vouched is not None and state.enqueue_checks_keys(vouched[1].tenant):
            key_id, record = vouched
            return Caller(record.tenant, key_id, keys.records.guard(key_id, record))
    return await _check(state, key)


def refused_key(state: GatewayState, key_id: str | None) -> HTTPException:
    """The 401 of a key the enqueue found revoked or rotated."""
    if state.key_cache is not None and key_id is not None:
        state.key_cache.forget(key_id)
    return _unauthorized(_NOT_VALID)


def _is_admin(state: GatewayState, key: str) -> bool:
    return bool(state.admin_key) and hmac.compare_digest(
        key.encode(), (state.admin_key or "").encode()
    )


async def _check(state: GatewayState, key: str) -> Caller:
    if _is_admin(state, key):
        return Caller(tenant=None, key_id=None)
    # an ill-formed key is refused without a lookup (or a connection to the store)
    found = await (await state.keys()).authenticate(key) if parse_key(key) else None
    if found is None:
        raise _unauthorized(_NOT_VALID)
    key_id, tenant = found
    return Caller(tenant=tenant, key_id=key_id)
