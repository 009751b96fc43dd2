"""``fairlane gateway MODULE:APP``: serve an app's HTTP gateway with uvicorn."""

from __future__ import annotations

from typing import Annotated

import typer

from fairlane.cli._common import EXIT_USAGE, AppSpec, RedisUrl, fail, load_app

__all__ = ["gateway"]


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
) -> None:
    """Serve the HTTP gateway: tenants submit and follow jobs with API keys
    (`fairlane tenants create`); the OpenAPI spec is at /openapi.json, the operator
    dashboard at /ui (log in with the admin key)."""
    try:
        import uvicorn  # noqa: PLC0415 - an optional dependency (fairlane[gateway])

        from fairlane.gateway import create_app  # noqa: PLC0415 - needs fastapi
    except ImportError as exc:
        fail(f"the gateway needs fairlane[gateway] installed: {exc}", EXIT_USAGE)
    app = load_app(app_spec, redis_url)
    try:
        api = create_app(
            app,
            admin_key=admin_key,
            ui=ui,
            ui_read_only=read_only_ui,
            metrics=metrics,
            metrics_require_admin=metrics_require_admin,
        )
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    uvicorn.run(api, host=host, port=port, log_level=log_level, access_log=False)


if __name__ == "__main__":
    typer.run(gateway)
