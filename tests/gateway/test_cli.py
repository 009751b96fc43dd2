"""``fairlane tenants`` (create, list, rotate, revoke) and ``fairlane gateway``'s checks."""

from __future__ import annotations

import importlib
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
import typer
import uvicorn
from typer.testing import CliRunner

from fairlane import App
from fairlane.cli import tenants_cli
from fairlane.cli.gateway import gateway
from fairlane.gateway import ApiKeys
from fairlane.store.apikeys import KeyRecords
from tests.e2e.helpers import fast_settings


def _authenticate(redis_url: str, namespace: str, key: str) -> tuple[str, str] | None:
    async def check() -> tuple[str, str] | None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await ApiKeys(KeyRecords(client, namespace)).authenticate(key)
        finally:
            await client.aclose()

    return anyio.run(check)


def test_create_list_rotate_revoke(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = App(namespace, redis_url=redis_url, settings=fast_settings())
    monkeypatch.setattr(tenants_cli, "load_app", lambda spec, url=None: app)
    runner = CliRunner()

    def invoke(*args: str) -> tuple[int, str, str]:
        result = runner.invoke(tenants_cli.tenants_app, list(args))
        return result.exit_code, result.stdout, result.stderr

    code, out, err = invoke("create", "x:app", "acme")
    assert code == 0, err
    key = out.strip()
    key_id = key.split("_")[1]
    assert "shown once" in err and key_id in err
    assert _authenticate(redis_url, namespace, key) == (key_id, "acme")

    code, out, _ = invoke("list", "x:app")
    assert code == 0 and key_id in out and "acme" in out and key not in out

    code, out, _ = invoke("rotate", "x:app", key_id)
    assert code == 0
    new_key = out.strip()
    assert new_key != key and new_key.split("_")[1] == key_id
    assert _authenticate(redis_url, namespace, key) is None
    assert _authenticate(redis_url, namespace, new_key) == (key_id, "acme")

    code, out, _ = invoke("revoke", "x:app", key_id)
    assert code == 0 and "revoked" in out
    assert _authenticate(redis_url, namespace, new_key) is None
    code, _, err = invoke("revoke", "x:app", key_id)
    assert code == 1 and "no active API key" in err
    code, _, err = invoke("rotate", "x:app", key_id)
    assert code == 1
    code, out, _ = invoke("list", "x:app")
    assert code == 0 and "no API keys" in out
    code, _, err = invoke("create", "x:app", " spaced ")
    assert code == 2


def test_gateway_refuses_a_short_admin_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # the module, not the command of the same name that fairlane.cli exports
    gateway_cli = importlib.import_module("fairlane.cli.gateway")

    monkeypatch.setattr(gateway_cli, "load_app", lambda spec, url=None: App("t_gw"))
    cli = typer.Typer()
    cli.command()(gateway)
    result = CliRunner().invoke(cli, ["x:app", "--admin-key", "short"])
    assert result.exit_code == 2 and "16 characters" in result.stderr


def test_gateway_refuses_an_app_that_exposes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    gateway_cli = importlib.import_module("fairlane.cli.gateway")
    private = App("t_gw")

    @private.task(name="purge_customer_data")
    async def purge(customer: str) -> None: ...

    monkeypatch.setattr(gateway_cli, "load_app", lambda spec, url=None: private)
    cli = typer.Typer()
    cli.command()(gateway)
    result = CliRunner().invoke(cli, ["x:app"])
    assert result.exit_code == 2
    assert "exposes no task" in result.stderr and "gateway=True" in result.stderr


def test_gateway_gives_the_admin_key_the_scopes_it_is_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gateway_cli = importlib.import_module("fairlane.cli.gateway")
    exposed = App("t_gw")

    @exposed.task(name="hello", gateway=True)
    async def hello() -> None: ...

    monkeypatch.setattr(gateway_cli, "load_app", lambda spec, url=None: exposed)
    served: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda api, **_: served.append(api))
    cli = typer.Typer()
    cli.command()(gateway)
    key = ["x:app", "--admin-key", "k" * 20]
    assert CliRunner().invoke(cli, key).exit_code == 0
    assert CliRunner().invoke(cli, [*key, "--admin-scopes", "read, operate"]).exit_code == 0
    assert [api.state.gateway.admin_scopes for api in served] == [("read",), ("read", "operate")]
    refused = CliRunner().invoke(cli, [*key, "--admin-scopes", "read,submit"])
    assert refused.exit_code == 2 and "unknown admin scope(s) submit" in refused.stderr
