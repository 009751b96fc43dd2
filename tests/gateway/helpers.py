"""Shared pieces of the gateway tests: an app with a few tasks, keys, an HTTP client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI

from fairlane import App
from fairlane.config.pools import parse_config
from fairlane.gateway import ApiKeys, create_app
from fairlane.runtime.context import Context
from tests.e2e.helpers import app_keys, fast_settings

ADMIN_KEY = "admin-" + "x" * 32


def build_app(
    namespace: str, redis_url: str, config: dict[str, Any] | None = None, **settings: Any
) -> App:
    app = App(
        namespace,
        redis_url=redis_url,
        settings=fast_settings(**settings),
        config=parse_config(config) if config else None,
    )

    @app.task(gateway=True, name="add", attempts=1)
    async def add(a: int, b: int) -> int:
        return a + b

    @app.task(gateway=True, name="boom", attempts=1)
    async def boom(message: str) -> None:
        raise LookupError(message)

    @app.task(gateway=True, name="echo", attempts=1)
    async def echo(text: str = "", times: int = 1) -> str:
        return text * times

    @app.task(name="purge_customer_data", attempts=1)
    async def purge_customer_data(customer: str) -> str:
        # the platform's own: not exposed, so no tenant key can call it
        return customer

    @app.workflow(gateway=True, name="approval")
    async def approval(ctx: Context, doc: str) -> Any:
        return await ctx.wait_for_signal("approve", timeout=60)

    return app


@dataclass
class Gateway:
    app: App
    client: httpx.AsyncClient
    keys: ApiKeys
    api: FastAPI

    async def key(self, tenant: str) -> dict[str, str]:
        minted = await self.keys.create(tenant)
        return {"Authorization": f"Bearer {minted.key}"}


@asynccontextmanager
async def gateway(
    namespace: str, redis_url: str, config: dict[str, Any] | None = None, **settings: Any
) -> AsyncIterator[Gateway]:
    app = build_app(namespace, redis_url, config, **settings)
    async with app:
        api = create_app(app, admin_key=ADMIN_KEY)
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield Gateway(app, client, ApiKeys(app.store.key_records), api)


async def stored_keys(redis_url: str, namespace: str) -> set[bytes]:
    """The app's keys but its counters and wake tokens, which every enqueue call touches."""
    keys = await app_keys(redis_url, namespace)
    return {k for k in keys if not k.endswith((b":stats", b":wake"))}


def pool(capacity: float, response_when_full: str) -> dict[str, Any]:
    """A pool on the default lane of one class, reserving exactly the declared units."""
    return {
        "pools": {
            "default": {
                "capacity_units": capacity,
                "classes": {
                    "standard": {
                        "nominal_share": 1.0,
                        "max_queue": 1000,
                        "response_when_full": response_when_full,
                    }
                },
            }
        },
        "estimation": {"safety_multiplier": 1.0},
    }
