"""The dashboard's pages: the login form, the single page app, its static files.

Pages answer an unauthenticated browser with a redirect to the login page. The login
posts the admin key as a form (read here without a form-parsing dependency), sets the
session cookie and sends the browser to the dashboard; ``POST logout`` clears it. The
static files are the package's own (``static/``): nothing is fetched from elsewhere,
and a strict Content-Security-Policy says so to the browser.
"""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import FileResponse, RedirectResponse, Response

from fairlane.gateway.state import GatewayState
from fairlane.gateway.ui.auth import (
    COOKIE,
    UiSettings,
    new_session,
    same_origin,
    session_secret,
    ui_operator,
    ui_settings,
    ui_state,
)

__all__ = ["STATIC", "pages_router"]

STATIC = Path(__file__).parent / "static"
_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
}
_SECURITY = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
_MAX_LOGIN_BODY = 4096
_ASSETS = {p.name: p for p in STATIC.iterdir() if p.is_file() and p.suffix in _TYPES}

State = Annotated[GatewayState, Depends(ui_state)]
Settings = Annotated[UiSettings, Depends(ui_settings)]


def _cookie_path(request: Request, settings: UiSettings) -> str:
    return (request.scope.get("root_path", "") + settings.path) or "/"


def _page(name: str) -> FileResponse:
    return FileResponse(STATIC / name, media_type="text/html", headers=_SECURITY)


def _go(request: Request, settings: UiSettings, where: str) -> RedirectResponse:
    return RedirectResponse(f"{_cookie_path(request, settings).rstrip('/')}/{where}", 303)


router = APIRouter(include_in_schema=False)


@router.get("")
async def root(request: Request, settings: Settings) -> RedirectResponse:
    return _go(request, settings, "")


@router.get("/")
async def index(request: Request, state: State, settings: Settings) -> Response:
    try:
        await ui_operator(request, state)
    except HTTPException:
        return _go(request, settings, "login")
    return _page("index.html")


@router.get("/login")
async def login_page() -> Response:
    return _page("login.html")


@router.post("/login")
async def login(request: Request, state: State, settings: Settings) -> Response:
    if not same_origin(request):
        raise HTTPException(403, "cross-origin login refused")
    body = await request.body()
    if len(body) > _MAX_LOGIN_BODY:
        raise HTTPException(413, "the login form is too large")
    key = parse_qs(body.decode("utf-8", "replace")).get("key", [""])[0]
    admin = state.admin_key
    if not admin:
        raise HTTPException(403, "the dashboard needs the gateway's admin key to be set")
    if not key or not hmac.compare_digest(key.encode(), admin.encode()):
        return _go(request, settings, "login?failed=1")
    answer = _go(request, settings, "")
    answer.set_cookie(
        COOKIE,
        new_session(session_secret(admin), settings.session_seconds),
        max_age=settings.session_seconds,
        path=_cookie_path(request, settings),
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return answer


@router.post("/logout")
async def logout(request: Request, settings: Settings) -> Response:
    if not same_origin(request):
        raise HTTPException(403, "cross-origin logout refused")
    answer = _go(request, settings, "login")
    answer.delete_cookie(COOKIE, path=_cookie_path(request, settings))
    return answer


@router.get("/static/{name}")
async def static(name: str) -> Response:
    # only the package's own files, by exact name: no name can reach elsewhere
    path = _ASSETS.get(name)
    if path is None:
        raise HTTPException(404, f"no static file {name!r}")
    return FileResponse(path, media_type=_TYPES[path.suffix], headers=_SECURITY)


def pages_router() -> APIRouter:
    return router
