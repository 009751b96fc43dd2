"""Who may use the operator dashboard, and how its writes are protected.

The dashboard has one identity: the operator holding the gateway's admin key. A browser
logs in once (``POST /ui/login`` with the key) and gets a session cookie: HttpOnly,
SameSite=Strict, scoped to the dashboard's path, ``<expiry>.<nonce>.<signature>`` signed
with HMAC-SHA256 under a secret derived from the admin key (so rotating the key ends
every session). Calls under ``/ui/api`` also accept ``Authorization: Bearer <admin key>``.

What the operator may change: the jobs' actions (``UiSettings.actions``: cancel, retry,
re-drive) for the admin key, and pauses (pause, resume, quarantine) only when the admin
key has the ``operate`` scope (``create_app(admin_scopes=...)``,
``fairlane gateway --admin-scopes read,operate``); without it a pause call answers 403
and changes nothing. ``Operator`` carries the key's scopes and its public id, which the
audit trail records as who acted.

Writes made with the cookie need the CSRF token (``X-CSRF-Token``): an HMAC of the
session's nonce that the page fetches from ``/ui/api/session``. A cross-site form can
neither read it nor set a header, and an ``Origin`` other than the dashboard's own is
refused as well. A bearer call carries no ambient credential and needs no token.

The dependencies here (``ui_state``, ``ui_settings``, ``ui_operator``) are what a host
application overrides (``api.dependency_overrides``) to supply its own state or auth.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from fairlane.gateway.apikeys import OPERATE
from fairlane.gateway.state import GatewayState

__all__ = [
    "ACTIONS",
    "COOKIE",
    "Operator",
    "UiSettings",
    "csrf_token",
    "new_session",
    "require_operate",
    "require_write",
    "session_secret",
    "ui_operator",
    "ui_settings",
    "ui_state",
    "verify_session",
]

COOKIE = "fairlane_ui"
ACTIONS = frozenset({"cancel", "retry", "redrive"})


@dataclass(frozen=True, slots=True)
class UiSettings:
    """What the dashboard lets its operator do: ``read_only`` refuses every write (403);
    ``actions`` are the writes allowed otherwise; sessions last ``session_seconds``."""

    read_only: bool = False
    actions: frozenset[str] = field(default=ACTIONS)
    session_seconds: int = 8 * 3600
    path: str = "/ui"

    def __post_init__(self) -> None:
        unknown = set(self.actions) - ACTIONS
        if unknown:
            raise ValueError(
                f"unknown dashboard actions {sorted(unknown)}; known: {sorted(ACTIONS)}"
            )
        if self.session_seconds < 60:
            raise ValueError("sessions must last at least 60 seconds")

    def allows(self, action: str) -> bool:
        return not self.read_only and action in self.actions


@dataclass(frozen=True, slots=True)
class Operator:
    """An authenticated caller: ``nonce`` names its browser session (None: bearer key);
    ``scopes`` what its key may do (``operate``: pauses); ``key_id`` how the audit trail
    names it ('': the gateway's admin key, by ``GatewayState.admin_key_id``)."""

    nonce: str | None
    scopes: tuple[str, ...] = ("read",)
    key_id: str = ""

    @property
    def operates(self) -> bool:
        return OPERATE in self.scopes

    @property
    def by_cookie(self) -> bool:
        return self.nonce is not None


def session_secret(admin_key: str) -> bytes:
    # a secret of its own, so a leaked cookie signature says nothing about the key
    return hmac.new(admin_key.encode(), b"fairlane-ui-session-v1", hashlib.sha256).digest()


def _sign(secret: bytes, message: str) -> str:
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def new_session(secret: bytes, seconds: int, now: float | None = None) -> str:
    expiry = int((time.time() if now is None else now) + seconds)
    nonce = secrets.token_urlsafe(18)
    return f"{expiry}.{nonce}.{_sign(secret, f'{expiry}.{nonce}')}"


def verify_session(secret: bytes, value: str, now: float | None = None) -> str | None:
    """The nonce of a valid, unexpired session cookie, else None."""
    parts = value.split(".")
    if len(parts) != 3 or not parts[0].isdigit():
        return None
    expiry, nonce, signature = parts
    if not hmac.compare_digest(_sign(secret, f"{expiry}.{nonce}"), signature):
        return None
    if int(expiry) < (time.time() if now is None else now):
        return None
    return nonce


def csrf_token(secret: bytes, nonce: str) -> str:
    return _sign(secret, f"csrf.{nonce}")


def ui_state(request: Request) -> GatewayState:
    """The gateway state the dashboard reads (override to serve another app)."""
    state: GatewayState | None = getattr(request.app.state, "gateway", None)
    if state is None:
        raise HTTPException(500, "the dashboard is mounted without a gateway state")
    return state


def ui_settings(request: Request) -> UiSettings:
    """The dashboard's settings (override to change them per host)."""
    settings: UiSettings | None = getattr(request.app.state, "fairlane_ui", None)
    return settings if settings is not None else UiSettings()


def _admin_key(state: GatewayState) -> str:
    if not state.admin_key:
        raise HTTPException(403, "the dashboard needs the gateway's admin key to be set")
    return state.admin_key


async def ui_operator(
    request: Request, state: Annotated[GatewayState, Depends(ui_state)]
) -> Operator:
    """The admin, by bearer key or session cookie; 401 otherwise (pages turn it into a
    redirect to the login page)."""
    key = _admin_key(state)
    header = request.headers.get("authorization", "")
    scheme, _, credential = header.partition(" ")
    if scheme.lower() == "bearer" and credential:
        if hmac.compare_digest(credential.strip().encode(), key.encode()):
            return Operator(None, state.admin_scopes)
        raise HTTPException(401, "the key is not the admin key", {"WWW-Authenticate": "Bearer"})
    cookie = request.cookies.get(COOKIE)
    nonce = verify_session(session_secret(key), cookie) if cookie else None
    if nonce is None:
        raise HTTPException(401, "log in with the admin key", {"WWW-Authenticate": "Bearer"})
    return Operator(nonce, state.admin_scopes)


def same_origin(request: Request) -> bool:
    """False when the browser says the request comes from another origin."""
    origin = request.headers.get("origin")
    if origin is None:
        # browsers send Origin on every cross-site POST: its absence is no cross-site form
        return True
    host = request.headers.get("host", "")
    return origin in {f"http://{host}", f"https://{host}"}


def require_write(
    action: str, request: Request, who: Operator, state: GatewayState, settings: UiSettings
) -> None:
    """Refuse a write: 403 when read-only or the action is not allowed, or when a cookie
    call lacks the CSRF token or comes from another origin."""
    if settings.read_only:
        raise HTTPException(403, "the dashboard is read-only")
    if action not in settings.actions:
        raise HTTPException(403, f"the dashboard does not allow {action!r}")
    _same_session(request, who, state)


def require_operate(
    request: Request, who: Operator, state: GatewayState, settings: UiSettings
) -> None:
    """Refuse a pause, resume or quarantine: 403 when read-only, when the key lacks the
    ``operate`` scope, or when a cookie call lacks the CSRF token or comes from another
    origin."""
    if settings.read_only:
        raise HTTPException(403, "the dashboard is read-only")
    if not who.operates:
        raise HTTPException(
            403,
            f"the admin key lacks the {OPERATE!r} scope that pauses need "
            f"(fairlane gateway --admin-scopes read,{OPERATE})",
        )
    _same_session(request, who, state)


def _same_session(request: Request, who: Operator, state: GatewayState) -> None:
    """A cookie call comes from the dashboard's own page: same origin, CSRF token."""
    if who.nonce is None:
        return
    if not same_origin(request):
        raise HTTPException(403, "cross-origin write refused")
    expected = csrf_token(session_secret(_admin_key(state)), who.nonce)
    sent = request.headers.get("x-csrf-token", "")
    if not hmac.compare_digest(sent.encode(), expected.encode()):
        raise HTTPException(403, "missing or wrong CSRF token (X-CSRF-Token)")
