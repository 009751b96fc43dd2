"""Fairlane's settings: the model, how it is loaded, and which source set each value.

This module owns ``Settings``, the whole model (its sections are
``fairlane.config.sections``), and its loading. Values are taken, highest precedence
first, from explicit keyword arguments, ``FAIRLANE_...`` environment variables (nested
with ``__``, e.g. ``FAIRLANE_LEASE__DURATION=20``), ``fairlane.toml`` in the project
directory, the ``[tool.fairlane]`` table of the project's ``pyproject.toml``, and the
defaults (the sources are ``fairlane.config.sources``). ``load_settings`` builds the
model, raising ``ConfigError`` with every problem and the source behind it;
``explain_settings`` reports where each leaf setting came from (``fairlane config
view``; ``fairlane.config.origins``). All durations are seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fairlane.config.files import ConfigError
from fairlane.config.frontdoor import FrontDoorSettings
from fairlane.config.origins import SettingOrigin, describe, layers, source_of
from fairlane.config.sections import (
    ConnectionSettings,
    DurabilitySettings,
    LeaseSettings,
    PayloadSettings,
    PressureSettings,
    QueueSettings,
    ServerSettings,
    WorkerSettings,
)
from fairlane.config.sources import (
    LoadContext,
    current_context,
    file_and_env_sources,
    leaf_paths,
    load_context,
    loading,
    merged,
)
from fairlane.config.tenants import TenantSettings
from fairlane.policy.capacityneed import DEFAULT_HORIZON_S
from fairlane.policy.retention import DEFAULT_AUDIT_ENTRIES

# The sections are imported from here by much of the project, as is ConfigError: this
# module is the settings' one public address.
__all__ = [
    "ConfigError",
    "ConnectionSettings",
    "DurabilitySettings",
    "FrontDoorSettings",
    "LeaseSettings",
    "PayloadSettings",
    "PressureSettings",
    "QueueSettings",
    "ServerSettings",
    "SettingOrigin",
    "Settings",
    "TenantSettings",
    "WorkerSettings",
    "explain_settings",
    "load_settings",
]


class Settings(BaseModel):
    """All Fairlane settings. Prefer ``load_settings`` to building this directly: built
    alone, it reads the sources of the working directory and the process's environment
    under the values it is given, as ``load_settings`` does without its error report."""

    model_config = ConfigDict(extra="forbid")

    def __init__(self, **values: Any) -> None:
        sources = file_and_env_sources(type(self), current_context())
        super().__init__(**merged(values, *(table for _, table in sources)))

    redis_url: str | None = None
    """Redis/Valkey URL, e.g. redis://localhost:6379/0; None if not configured."""
    max_payload_bytes: int = Field(default=1_048_576, ge=1)
    """Largest accepted job payload, in bytes."""
    default_lane: str = Field(default="default", min_length=1)
    """Lane of jobs that name none."""
    lanes_file: Path | None = None
    """TOML file of lanes' service classes ([lanes.<name>.classes.<class>]); relative to the project
    directory."""
    shards: int = Field(default=1, ge=1, le=1024)
    """Scheduling shards of each app: tenants are spread over them by a stable hash; every process
    of an app must use the same count."""
    lease: LeaseSettings = Field(default_factory=LeaseSettings)
    """Job leases."""
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    """Workers."""
    server: ServerSettings = Field(default_factory=ServerSettings)
    """Dev server."""
    payloads: PayloadSettings = Field(default_factory=PayloadSettings)
    """Large payloads."""
    connection: ConnectionSettings = Field(default_factory=ConnectionSettings)
    """Server timeouts."""
    durability: DurabilitySettings = Field(default_factory=DurabilitySettings)
    """Acknowledged enqueues."""
    tenants: TenantSettings = Field(default_factory=TenantSettings)
    """What is kept of idle tenants."""
    queues: QueueSettings = Field(default_factory=QueueSettings)
    """Bounds on queued jobs in lanes without an admission pool."""
    audit_entries: int = Field(default=DEFAULT_AUDIT_ENTRIES, ge=100, le=100_000_000)
    """Entries the HTTP gateway's audit trail keeps, newest first (trimmed in whole blocks, so
    up to one block more)."""
    front_door: FrontDoorSettings = Field(default_factory=FrontDoorSettings)
    """The HTTP gateway's bounds per tenant, in each gateway process."""
    autoscale_horizon: float = Field(default=DEFAULT_HORIZON_S, gt=0, le=86_400)
    """Seconds the backlog outside batch classes is to clear in: /autoscale's
    slots_needed_horizon and fairlane_lane_slots_needed{for="horizon"} are the slots that do it."""

    @field_validator("lanes_file")
    @classmethod
    def _anchor_lanes_file(cls, value: Path | None) -> Path | None:
        """A relative path is the project's, wherever the process was started."""
        if value is None or value.is_absolute():
            return value
        return current_context().project_dir / value


def _load(ctx: LoadContext, overrides: dict[str, Any]) -> Settings:
    with loading(ctx):
        try:
            return Settings(**overrides)
        except ValidationError as exc:
            raise ConfigError(describe(exc, layers(Settings, ctx, overrides))) from exc


def load_settings(
    *,
    project_dir: Path | str | None = None,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> Settings:
    """Load settings from all sources.

    ``project_dir`` holds ``fairlane.toml`` / ``pyproject.toml`` (default: the working
    directory); ``environ`` defaults to ``os.environ``. Keyword ``overrides`` are top-level
    fields (nested ones as dicts or models) and win over every other source, ``None`` included.
    Raises ``ConfigError`` with every problem and the source that caused it.
    """
    return _load(load_context(project_dir, environ), overrides)


def explain_settings(
    *,
    project_dir: Path | str | None = None,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> list[SettingOrigin]:
    """Load settings like ``load_settings``; report each leaf's value and source in model order."""
    ctx = load_context(project_dir, environ)
    settings = _load(ctx, overrides)
    found = layers(Settings, ctx, overrides)
    rows = []
    for path in leaf_paths(Settings):
        value: Any = settings
        for key in path:
            value = getattr(value, key)
        rows.append(SettingOrigin(".".join(path), value, source_of(path, found)))
    return rows
