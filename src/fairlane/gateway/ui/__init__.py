"""The operator dashboard: a live view of lanes, classes, tenants, throttles, jobs, dead
letters and workflow runs, served at ``/ui`` by the HTTP gateway or by your own app.

``fairlane gateway MODULE:APP --admin-key ...`` serves it at ``/ui`` (``--no-ui`` leaves
it out, ``--read-only-ui`` refuses every write). In code, either of:

.. code-block:: python

    api = create_app(app, admin_key=key)           # the gateway, with /ui mounted
    mount_ui(host_api, GatewayState(app, admin_key=key), read_only=True)

Pauses (``pausing``: pause and resume a tenant, a task or a lane, quarantine a tenant)
need the admin key's ``operate`` scope: ``create_app(app, admin_key=key,
admin_scopes=("read", "operate"))``.

``mount_ui`` puts the state and the settings on ``host_api.state`` and includes
``ui_router()``. A host that keeps its own state, settings or login overrides the
dependencies instead (``fairlane.gateway.ui.auth``)::

    host_api.include_router(ui_router(), prefix="/ops")   # now at /ops/ui
    host_api.dependency_overrides[ui_state] = lambda: my_gateway_state
    host_api.dependency_overrides[ui_settings] = lambda: UiSettings(path="/ops/ui")
    host_api.dependency_overrides[ui_operator] = my_operator_check  # returns Operator

An ``Operator(nonce=None)`` from an overridden ``ui_operator`` skips the CSRF check, so
a host doing so must protect writes itself. Modules: ``auth`` (session cookie, CSRF,
permissions), ``queries`` (the live view), ``jobs`` (finding jobs), ``actions``
(cancel, retry, re-drive), ``api``, ``pausing`` and ``pages`` (the routes), ``static/`` (the
page, its scripts -- ``operate.js`` the pause buttons, the banner of what is paused and
the dialog an operator's change asks in -- and its style).
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from fairlane.gateway.state import GatewayState
from fairlane.gateway.ui.api import api_router
from fairlane.gateway.ui.auth import (
    ACTIONS,
    Operator,
    UiSettings,
    ui_operator,
    ui_settings,
    ui_state,
)
from fairlane.gateway.ui.pages import pages_router
from fairlane.gateway.ui.pausing import pausing_router

__all__ = [
    "ACTIONS",
    "Operator",
    "UiSettings",
    "mount_ui",
    "ui_operator",
    "ui_router",
    "ui_settings",
    "ui_state",
]


def ui_router(path: str = "/ui") -> APIRouter:
    """The dashboard's routes under ``path``: pages, static files and ``/api``."""
    router = APIRouter()
    router.include_router(pages_router(), prefix=path)
    router.include_router(api_router(), prefix=path)
    router.include_router(pausing_router(), prefix=path)
    return router


def mount_ui(
    api: FastAPI,
    state: GatewayState | None = None,
    *,
    read_only: bool = False,
    actions: frozenset[str] = ACTIONS,
    path: str = "/ui",
) -> UiSettings:
    """Serve the dashboard from ``api`` at ``path``. ``state`` defaults to the gateway's
    own (``api.state.gateway``); ``actions`` are the writes allowed (cancel, retry,
    redrive) unless ``read_only``."""
    if state is not None:
        api.state.gateway = state
    settings = UiSettings(read_only=read_only, actions=frozenset(actions), path=path)
    api.state.fairlane_ui = settings
    api.include_router(ui_router(path))
    return settings
