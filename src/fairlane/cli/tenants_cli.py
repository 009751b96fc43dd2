"""``fairlane tenants``: the HTTP gateway's tenant API keys: create, rotate, revoke, list;
and ``audit``, the trail of the gateway's decisions that changed state.

A key is printed once, when it is created or rotated; only its SHA-256 digest is stored.
``--scopes read,submit`` narrows a key (all scopes unless told) and ``--expires 30d``
ends it, counted from now by the server's clock; ``rotate`` keeps both unless given.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
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
    utc_ms,
)
from fairlane.gateway.apikeys import SCOPES, ApiKeys, KeyNotFound, KeyRecord, MintedKey
from fairlane.policy.retention import parse_duration
from fairlane.store.apikeys import KeyRecords
from fairlane.store.audit import ACTIONS, AuditEntry
from fairlane.store.connection import AsyncClient, create_client

__all__ = ["tenants_app"]

tenants_app = typer.Typer(
    help="API keys of the HTTP gateway: one or more per tenant.", no_args_is_help=True
)

KeyId = Annotated[str, typer.Argument(metavar="KEY_ID", help="A key's public id.")]
Scopes = Annotated[
    str | None,
    typer.Option(
        "--scopes",
        metavar="SCOPES",
        help=f"What the key may do, comma-separated, of {','.join(SCOPES)} (default: all).",
        show_default=False,
    ),
]
Expires = Annotated[
    str | None,
    typer.Option(
        "--expires",
        metavar="DURATION",
        help='When the key stops working, from now: "12h", "30d" (default: never).',
        show_default=False,
    ),
]


@dataclass(frozen=True, slots=True)
class _Limits:
    """A key's scopes and lifetime as given on the command line (None: not given)."""

    scopes: tuple[str, ...] | None = None
    expires: timedelta | None = None

    @classmethod
    def parse(cls, scopes: str | None, expires: str | None) -> _Limits:
        named = None if scopes is None else tuple(s.strip() for s in scopes.split(",") if s.strip())
        lifetime = None if expires is None else timedelta(seconds=parse_duration(expires))
        return cls(named, lifetime)


def _keys(app: App) -> tuple[ApiKeys, AsyncClient]:
    target = locate_server(settings_or_fail(), app=app)
    if target.url is None:
        fail(f"no server to talk to: {target.source} is not running (give --redis-url)")
    client = create_client(target.url, socket_connect_timeout=5.0)
    records = KeyRecords(client, app.name, app.shards, app.settings.audit_entries)
    return ApiKeys(records), client


async def _with_keys(app: App, action: str, key_or_tenant: str, limits: _Limits) -> object:
    keys, client = _keys(app)
    try:
        if action == "create":
            scopes = SCOPES if limits.scopes is None else limits.scopes
            return await keys.create(key_or_tenant, scopes=scopes, expires=limits.expires)
        if action == "rotate":
            return await keys.rotate(key_or_tenant, scopes=limits.scopes, expires=limits.expires)
        if action == "revoke":
            return await keys.revoke(key_or_tenant)
        return await keys.list(), await keys.records.server_ms()
    finally:
        await client.aclose()


def _print_minted(minted: MintedKey, what: str) -> None:
    err_console().print(
        f"{what} key [bold]{minted.key_id}[/] for tenant {escape(minted.tenant)!r}; "
        "it is shown once, store it now:"
    )
    typer.echo(minted.key)  # alone on stdout, for scripts


def _key_action(
    app_spec: str,
    redis_url: str | None,
    action: str,
    argument: str,
    limits: tuple[str | None, str | None] = (None, None),
) -> object:
    """Run ``action`` on the app's keys; an unknown key, a bad tenant, scope or duration
    is an error."""
    try:
        parsed = _Limits.parse(*limits)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    app = load_app(app_spec, redis_url)
    try:
        return run(_with_keys(app, action, argument, parsed))
    except KeyNotFound as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)


@tenants_app.command("create")
def create(
    app_spec: AppSpec,
    tenant: Annotated[str, typer.Argument(metavar="TENANT", show_default=False)],
    redis_url: RedisUrl = None,
    scopes: Scopes = None,
    expires: Expires = None,
) -> None:
    """Create an API key for TENANT and print it (once)."""
    minted = _key_action(app_spec, redis_url, "create", tenant, (scopes, expires))
    assert isinstance(minted, MintedKey)
    _print_minted(minted, "created")


@tenants_app.command("rotate")
def rotate(
    app_spec: AppSpec,
    key_id: KeyId,
    redis_url: RedisUrl = None,
    scopes: Scopes = None,
    expires: Expires = None,
) -> None:
    """Give KEY_ID a new secret and print the new key (once); the old one stops working.
    It keeps its scopes and expiry unless new ones are given."""
    minted = _key_action(app_spec, redis_url, "rotate", key_id, (scopes, expires))
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
    """List the keys: id, tenant, created, scopes, expiry (never the keys themselves)."""
    app = load_app(app_spec, redis_url)
    listed = run(_with_keys(app, "list", "", _Limits()))
    assert isinstance(listed, tuple)
    records, now_ms = listed
    if not records:
        console().print("no API keys")
        return
    table = Table(
        "key id", "tenant", "created (UTC)", "scopes", "expires (UTC)", box=None, pad_edge=False
    )
    for key_id, record in records.items():
        table.add_row(
            key_id,
            escape(record.tenant),
            utc_ms(record.created_ms, millis=False),
            "all" if set(record.scopes) >= set(SCOPES) else ",".join(record.scopes),
            _expiry(record, now_ms),
        )
    console().print(table)


def _expiry(record: KeyRecord, now_ms: int) -> str:
    if record.expires_ms is None:
        return "never"
    until = utc_ms(record.expires_ms, millis=False)
    return until + (" (expired)" if record.expired(now_ms) else "")


async def _read_audit(
    app: App, limit: int, tenant: str | None, action: str | None
) -> list[AuditEntry]:
    keys, client = _keys(app)
    try:
        return await keys.records.audit.read(limit, tenant=tenant, action=action)
    finally:
        await client.aclose()


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
        rows = [{"at": utc_ms(e.at_ms), **msgspec.structs.asdict(e)} for e in entries]
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
            utc_ms(e.at_ms),
            e.action,
            escape(e.key_id),
            escape(e.tenant),
            escape(e.outcome),
            escape(e.detail),
            escape(e.job_id),
        )
    console().print(table)
