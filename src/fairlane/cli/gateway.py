"""``fairlane gateway MODULE:APP``: serve an app's HTTP gateway with uvicorn.

With ``--workers N`` uvicorn runs N server processes on the one port; each imports the
app and builds its own gateway (``served``, from the options this process left in
``FAIRLANE_GATEWAY_SERVE``), with its own connections and its own metrics.
"""

from __future__ import annotations

import gc
import json
import os
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fairlane.cli._common import EXIT_USAGE, AppSpec, RedisUrl, fail, load_app

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["gateway", "served"]

#: the options a worker process of ``--workers`` builds its gateway from (JSON)
SERVE_ENV = "FAIRLANE_GATEWAY_SERVE"


def gateway(  # noqa: PLR0917 - each parameter is a command-line option
    app_spec: AppSpec,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    admin_key: Annotated[
        str | None,
        typer.Option(
            envvar="FAIRLANE_GATEWAY_ADMIN_KEY",
            help="A key (16+ characters) that may read any tenant's jobs.",
            show_default=False,
        ),
    ] = None,
    admin_scopes: Annotated[
        str,
        typer.Option(
            envvar="FAIRLANE_GATEWAY_ADMIN_SCOPES",
            help="What the admin key may do, comma-separated: read (always), and operate "
            "(pause and resume dispatch, quarantine tenants).",
        ),
    ] = "read",
    redis_url: RedisUrl = None,
    ui: Annotated[
        bool,
        typer.Option(
            "--ui/--no-ui",
            help="Serve the operator dashboard at /ui (needs --admin-key to log in).",
        ),
    ] = True,
    read_only_ui: Annotated[
        bool,
        typer.Option("--read-only-ui", help="The dashboard shows everything but changes nothing."),
    ] = False,
    metrics: Annotated[
        bool,
        typer.Option("--metrics/--no-metrics", help="Serve Prometheus metrics at /metrics."),
    ] = True,
    metrics_require_admin: Annotated[
        bool,
        typer.Option("--metrics-require-admin", help="/metrics answers the admin key only."),
    ] = False,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "info",
    workers: Annotated[
        int,
        typer.Option(
            min=1, help="Server processes on the port (each with its own connections and metrics)."
        ),
    ] = 1,
) -> None:
    """Serve the HTTP gateway: tenants submit and follow jobs with API keys
    (`fairlane tenants create`); the OpenAPI spec is at /openapi.json, the operator
    dashboard at /ui (log in with the admin key)."""
    try:
        import fastapi  # noqa: F401, PLC0415 - optional dependencies (fairlane[gateway])
        import uvicorn  # noqa: PLC0415
    except ImportError as exc:
        fail(f"the gateway needs fairlane[gateway] installed: {exc}", EXIT_USAGE)
    options: dict[str, Any] = {
        "spec": app_spec,
        "redis_url": redis_url,
        "admin_key": admin_key,
        "admin_scopes": [x.strip() for x in admin_scopes.split(",") if x.strip()],
        "ui": ui,
        "ui_read_only": read_only_ui,
        "metrics": metrics,
        "metrics_require_admin": metrics_require_admin,
    }
    try:
        api = _build(options)  # also with workers: a bad option fails here, not in each
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    if workers == 1:
        uvicorn.run(api, host=host, port=port, log_level=log_level, access_log=False)
        return
    os.environ[SERVE_ENV] = json.dumps(options)
    uvicorn.run(
        "fairlane.cli.gateway:served",
        factory=True,
        workers=workers,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
    )


def _build(options: dict[str, Any]) -> FastAPI:
    from fairlane.gateway import create_app  # noqa: PLC0415 - needs fastapi

    api = create_app(
        load_app(options["spec"], options["redis_url"]),
        admin_key=options["admin_key"],
        admin_scopes=options["admin_scopes"],
        ui=options["ui"],
        ui_read_only=options["ui_read_only"],
        metrics=options["metrics"],
        metrics_require_admin=options["metrics_require_admin"],
    )
    # what is built by now lives as long as the process: moved out of the collector's
    # generations, so its collections, a few per thousand requests, do not walk it
    gc.collect()
    gc.freeze()
    return api


def served() -> FastAPI:
    """The gateway of one worker process of ``--workers`` (uvicorn calls it by name)."""
    return _build(json.loads(os.environ[SERVE_ENV]))


if __name__ == "__main__":
    typer.run(gateway)
