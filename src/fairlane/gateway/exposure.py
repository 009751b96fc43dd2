"""Which tasks the gateway exposes: those registered with ``gateway=True``, and only those.

A task is private to the platform's own code unless it says otherwise, so that a task
registered for the platform's use (a data purge, a billing job) is never callable by a
tenant's key. The gateway refuses to start with nothing to expose, and its OpenAPI spec
names the exposed tasks only (the enum of ``SubmitRequest.task``); a request naming a
private task is answered exactly as one naming no task at all.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from fairlane.app import App

__all__ = ["NothingExposed", "exposed_tasks", "list_in_spec"]


class NothingExposed(ValueError):
    """The app exposes no task to the gateway."""


def exposed_tasks(app: App) -> list[str]:
    """The names of ``app``'s exposed tasks and workflows, sorted; ``NothingExposed``
    when there are none."""
    names = sorted(name for name, task in app.tasks.items() if task.options.gateway)
    if not names:
        raise NothingExposed(
            f"app {app.name!r} exposes no task to the gateway: a task (or workflow) is "
            "private unless registered with gateway=True, e.g. "
            "@app.task(name='summarize', gateway=True)"
        )
    return names


def list_in_spec(api: FastAPI, names: list[str]) -> None:
    """Have ``api``'s OpenAPI spec list ``names`` as the tasks a submit may name."""
    build = api.openapi

    def openapi() -> dict[str, Any]:
        first = api.openapi_schema is None
        schema = build()  # FastAPI keeps the spec it builds: it is marked once
        if first:
            submit = schema["components"]["schemas"]["SubmitRequest"]
            submit["properties"]["task"]["enum"] = list(names)
        return schema

    api.openapi = openapi  # type: ignore[method-assign]
