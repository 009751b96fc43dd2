"""``create_app``: a FastAPI app serving one Fairlane app over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from fairlane.app import App
from fairlane.config.frontdoor import FrontDoorSettings
from fairlane.gateway import jobs, runs
from fairlane.gateway.apikeys import check_admin_scopes
from fairlane.gateway.exposure import exposed_tasks, list_in_spec
from fairlane.gateway.frontdoor import FrontDoor, FrontDoorGate
from fairlane.gateway.lean import LeanApi
from fairlane.gateway.limits import BodyLimit
from fairlane.gateway.metrics import mount_metrics
from fairlane.gateway.responses import install_handlers
from fairlane.gateway.state import GatewayState
from fairlane.gateway.ui import mount_ui

__all__ = ["create_app"]


def create_app(
    app: App,
    *,
    admin_key: str | None = None,
    admin_scopes: Iterable[str] = ("read",),
    max_body_bytes: int | None = None,
    ui: bool = True,
    ui_read_only: bool = False,
    metrics: bool = True,
    metrics_require_admin: bool = False,
    front_door: FrontDoorSettings | None = None,
) -> FastAPI:
    """The HTTP gateway of ``app``; its OpenAPI spec is served at ``/openapi.json``.

    Only the tasks registered with ``gateway=True`` may be called (``NothingExposed``
    if there are none). The gateway connects ``app`` on first use unless it is
    connected already (and then leaves closing it to its owner). ``admin_key`` may read
    any tenant's jobs; with ``"operate"`` among its ``admin_scopes`` it may also pause
    and resume dispatch and quarantine tenants (the dashboard's ``/ui/api`` pause
    endpoints, ``fairlane.gateway.ui.pausing``). Bodies over ``max_body_bytes``
    (default: twice the app's ``max_payload_bytes``) get 413.
    With ``ui``, the operator dashboard is served at ``/ui`` (for the admin key only;
    ``ui_read_only`` refuses its writes): see ``fairlane.gateway.ui``. With ``metrics``,
    Prometheus metrics are served at ``/metrics`` (open, or for the admin key only with
    ``metrics_require_admin``): see ``fairlane.gateway.metrics``.
    Every request of the tenants' API passes the front door first, with the bounds per
    tenant of ``front_door`` (default: the app's ``front_door`` settings) and as many
    seats on the store as the app has connections: see ``fairlane.gateway.frontdoor``.
    """
    if admin_key is not None and len(admin_key) < 16:
        raise ValueError("the admin key must be at least 16 characters")
    exposed = exposed_tasks(app)  # a gateway with nothing to expose is a mistake
    state = GatewayState(
        app, admin_key=admin_key or None, admin_scopes=check_admin_scopes(admin_scopes)
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        governing = door.governed()
        try:
            async with governing:
                yield
        finally:
            await state.close()

    api = LeanApi(
        title=f"Fairlane gateway: {app.name}",
        version="1",
        summary="Submit and follow jobs of a Fairlane app; tenants authenticate with API keys.",
        openapi_url="/openapi.json",
        lifespan=lifespan,
    )
    api.state.gateway = state
    door = FrontDoor(
        state, front_door or app.settings.front_door, app.settings.connection.max_connections
    )
    api.state.front_door = door
    list_in_spec(api, exposed)
    install_handlers(api)
    api.include_router(jobs.router)
    api.include_router(runs.router)
    if ui:
        mount_ui(api, read_only=ui_read_only)
    limit = max_body_bytes or 2 * app.settings.max_payload_bytes
    # submits are answered before the middlewares, doing the body limit's and metrics' part
    front = api.serve_lean(jobs.SUBMIT_ROUTE, limit)
    front.door = door
    api.add_middleware(BodyLimit, limit=limit)
    # outside the body limit (a refused request's body is never read), inside the metrics
    api.add_middleware(FrontDoorGate, door=door, submit_path=jobs.SUBMIT_ROUTE.path)
    if metrics:  # after BodyLimit, so the counting middleware is outermost and sees its 413s
        api.state.metrics = mount_metrics(api, require_admin=metrics_require_admin)
        front.observe = api.state.metrics.observe
    return api
