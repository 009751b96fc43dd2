"""``fairlane tenants``: the HTTP gateway's tenant API keys: create, rotate, revoke, list;
and ``audit``, the trail of the gateway's decisions that changed state.

A key is printed once, when it is created or rotated; only its SHA-256 digest is stored.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated

import msgspec
import typer
from rich.markup import escape
from rich.table import Table

from fairlane.app import App
from fairlane.cli._common import (
    EXIT_USAGE,
    AppSpec,
    RedisUrl,
    console,
    err_console,
    fail,
    load_app,
    locate_server,
    run,
    settings_or_fail,
)
from fairlane.gateway.apikeys import ApiKeys, KeyNotFound, KeyRecord, MintedKey
from fairlane.store.apikeys import KeyRecords
from fairlane.store.audit import ACTIONS, AuditEntry
from fairlane.store.connection import AsyncClient, create_client

__all__ = ["tenants_app"]

tenants_app = typer.Typer(
    help="API keys of the HTTP gateway: one or more per tenant.", no_args_is_help=True
)

KeyId = Annotated[str, typer.Argument(metavar="KEY_ID", help="A key's public id.")]


def _keys(app: App) -> tuple[ApiKeys, AsyncClient]:
    target = locate_server(settings_or_fail(), app=app)
    if target.url is None:
        fail(f"no server to talk to: {target.source} is not running (give --redis-url)")
    client = create_client(target.url, socket_connect_timeout=5.0)
    records = KeyRecords(client, app.name, app.shards, app.settings.audit_entries)
    return ApiKeys(records), client


async def _with_keys(app: App, action: str, key_or_tenant: str) -> object:
    keys, client = _keys(app)
    try:
        if action == "create":
            return await keys.create(key_or_tenant)
        if action == "rotate":
            return await keys.rotate(key_or_tenant)
        if action == "revoke":
            return await keys.revoke(key_or_tenant)
        return await keys.list()
    finally:
        await client.aclose()


def _print_minted(minted: MintedKey, what: str) -> None:
    err_console().print(
        f"{what} key [bold]{minted.key_id}[/] for tenant {escape(minted.tenant)!r}; "
        "it is shown once, store it now:"
    )
    typer.echo(minted.key)  # alone on stdout, for scripts


def _key_action(app_spec: str, redis_url: str | None, action: str, argument: str) -> object:
    """Run ``action`` on the app's keys; an unknown key or a bad tenant is an error."""
    app = load_app(app_spec, redis_url)
    try:
        return run(_with_keys(app, action, argument))
    except KeyNotFound as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)


@tenants_app.command("create")
def create(
    app_spec: AppSpec,
    tenant: Annotated[str, typer.Argument(metavar="TENANT", show_default=False)],
    redis_url: RedisUrl = None,
) -> None:
    """Create an API key for TENANT and print it (once)."""
    minted = _key_action(app_spec, redis_url, "create", tenant)
    assert isinstance(minted, MintedKey)
    _print_minted(minted, "created")


@tenants_app.command("rotate")
def rotate(app_spec: AppSpec, key_id: KeyId, redis_url: RedisUrl = None) -> None:
    """Give KEY_ID a new secret and print the new key (once); the old one stops working."""
    minted = _key_action(app_spec, redis_url, "rotate", key_id)
    assert isinstance(minted, MintedKey)
    _print_minted(minted, "rotated")


@tenants_app.command("revoke")
def revoke(app_spec: AppSpec, key_id: KeyId, redis_url: RedisUrl = None) -> None:
    """Revoke KEY_ID: requests bearing it are refused from now on."""
    record = _key_action(app_spec, redis_url, "revoke", key_id)
    assert isinstance(record, KeyRecord)
    console().print(f"revoked key {key_id} of tenant {escape(record.tenant)!r}")


@tenants_app.command("list")
def list_keys(app_spec: AppSpec, redis_url: RedisUrl = None) -> None:
    """List the active keys: id, tenant, created (never the keys themselves)."""
    app = load_app(app_spec, redis_url)
    records = run(_with_keys(app, "list", ""))
    assert isinstance(records, dict)
    if not records:
        console().print("no API keys")
        return
    table = Table("key id", "tenant", "created (UTC)", box=None, pad_edge=False)
    for key_id, record in records.items():
        created = datetime.fromtimestamp(record.created_ms / 1000, UTC)
        table.add_row(key_id, escape(record.tenant), created.strftime("%Y-%m-%d %H:%M:%S"))
    console().print(table)


async def _read_audit(
    app: App, limit: int, tenant: str | None, action: str | None
) -> list[AuditEntry]:
    keys, client = _keys(app)
    try:
        return await keys.records.audit.read(limit, tenant=tenant, action=action)
    finally:
        await client.aclose()


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


@tenants_app.command("audit")
def audit(
    app_spec: AppSpec,
    *,
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Only this tenant's entries.")
    ] = None,
    action: Annotated[
        str | None, typer.Option("--action", help=f"Only one action: {', '.join(ACTIONS)}.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000)] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print the entries as JSON.")] = False,
    redis_url: RedisUrl = None,
) -> None:
    """Show the gateway's audit trail, newest first: submits, cancels, signals and key
    changes, each with its key id, tenant, outcome and the server's time."""
    if action is not None and action not in ACTIONS:
        fail(f"--action must be one of {', '.join(ACTIONS)}, not {action!r}", EXIT_USAGE)
    app = load_app(app_spec, redis_url)
    entries = run(_read_audit(app, limit, tenant, action))
    if as_json:
        rows = [{"at": _utc(e.at_ms), **msgspec.structs.asdict(e)} for e in entries]
        typer.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    if not entries:
        console().print("no audit entries")
        return
    table = Table(
        "time (UTC)",
        "action",
        "key id",
        "tenant",
        "outcome",
        "detail",
        "job / run",
        box=None,
        pad_edge=False,
    )
    for e in entries:
        table.add_row(
            _utc(e.at_ms),
            e.action,
            escape(e.key_id),
            escape(e.tenant),
            escape(e.outcome),
            escape(e.detail),
            escape(e.job_id),
        )
    console().print(table)
