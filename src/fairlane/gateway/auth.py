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

__all__ = ["Caller", "bearer", "caller", "gateway_state"]

#: the bearer credentials of a request (None when it has none)
bearer = HTTPBearer(auto_error=False, description="A tenant API key, or the admin key.")


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str | None  # None: the admin
    key_id: str | None

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


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(401, message, headers={"WWW-Authenticate": "Bearer"})


async def caller(
    state: Annotated[GatewayState, Depends(gateway_state)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Caller:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise _unauthorized("an API key is required: Authorization: Bearer <key>")
    key = credentials.credentials
    if state.admin_key and hmac.compare_digest(key.encode(), state.admin_key.encode()):
        return Caller(tenant=None, key_id=None)
    # an ill-formed key is refused without a lookup (or a connection to the store)
    found = await (await state.keys()).authenticate(key) if parse_key(key) else None
    if found is None:
        raise _unauthorized("the API key is not valid (unknown, revoked or rotated)")
    key_id, tenant = found
    return Caller(tenant=tenant, key_id=key_id)
