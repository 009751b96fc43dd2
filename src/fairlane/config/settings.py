"""Fairlane's settings: the model, where values come from, and which source set each one.

This module owns the ``Settings`` model and its loading rules. Values are taken, highest
precedence first, from explicit keyword arguments, ``FAIRLANE_...`` environment variables
(nested with ``__``, e.g. ``FAIRLANE_LEASE__DURATION=20``), ``fairlane.toml`` in the project
directory, the ``[tool.fairlane]`` table of the project's ``pyproject.toml``, and the defaults.
Loading is built on pydantic-settings sources; ``explain_settings`` evaluates every source on
its own to report where each leaf setting came from. All durations are seconds.
"""

from __future__ import annotations

import difflib
import json
import os
import tomllib
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    PyprojectTomlConfigSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from fairlane.config.units import parse_size

__all__ = [
    "ConfigError",
    "ConnectionSettings",
    "DurabilitySettings",
    "LeaseSettings",
    "PayloadSettings",
    "PressureSettings",
    "ServerSettings",
    "SettingOrigin",
    "Settings",
    "WorkerSettings",
    "explain_settings",
    "load_settings",
]

ENV_PREFIX = "FAIRLANE_"
ENV_NESTED_DELIMITER = "__"
TOML_FILE = "fairlane.toml"
PYPROJECT_FILE = "pyproject.toml"
PYPROJECT_LABEL = "pyproject.toml [tool.fairlane]"


class ConfigError(ValueError):
    """Settings could not be loaded: a file, an environment variable or a value is invalid."""


class LeaseSettings(BaseModel):
    """How long a running job is leased to its worker, and how expired leases are reclaimed."""

    model_config = ConfigDict(extra="forbid")

    duration: float = Field(default=30.0, gt=0, description="Lease length of a running job.")
    renew_interval: float = Field(
        default=10.0,
        gt=0,
        description="How often a worker renews its leases; must be below duration.",
    )
    sweep_interval: float = Field(
        default=5.0, gt=0, description="Period of the expired-lease sweep."
    )
    sweep_jitter: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="Random spread of the sweep period, as a fraction (0..1).",
    )
    sweep_batch: int = Field(
        default=200, ge=1, description="Most jobs reclaimed in one sweep pass."
    )

    @model_validator(mode="after")
    def _renew_before_expiry(self) -> Self:
        if self.renew_interval >= self.duration:
            raise ValueError(
                f"renew_interval ({self.renew_interval}) must be less than "
                f"duration ({self.duration}), or leases expire before they are renewed"
            )
        return self


class PressureSettings(BaseModel):
    """How a worker holds back under resource pressure (``fairlane.runtime.pressure``)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=True, description="Watch memory, CPU and pressure stalls; fetch less under them."
    )
    interval: float = Field(default=0.5, gt=0, description="Time between sensor readings.")
    memory_limit: int | None = Field(
        default=None,
        gt=0,
        description='Bytes (or "2GiB", "512m") the worker and its children may use; None: '
        "the container's cgroup limit, else the machine's RAM.",
    )
    memory_soft: float = Field(
        default=0.8, gt=0, le=1, description="Share of the limit above which fewer slots fill."
    )
    memory_hard: float = Field(
        default=0.9, gt=0, le=1, description="Share of the limit at which no new work is taken."
    )
    cpu_soft: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        description="Machine CPU busy share (0..1) above which fewer slots fill; None: off.",
    )
    psi_soft: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Stall percent (PSI some avg10) above which fewer slots fill; None: off.",
    )
    psi_hard: float = Field(
        default=90.0, ge=0, le=100, description="Stall percent at which the fewest slots fill."
    )
    min_fraction: float = Field(
        default=0.25, ge=0, le=1, description="Fewest slots filled under pressure, as a share."
    )
    recovery: float = Field(
        default=0.5, gt=0, description="Share of the slots regained per second as pressure eases."
    )

    @field_validator("memory_limit", mode="before")
    @classmethod
    def _parse_size(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip().isdigit():
            return parse_size(value)
        return value

    @model_validator(mode="after")
    def _soft_below_hard(self) -> Self:
        if self.memory_soft >= self.memory_hard:
            raise ValueError("memory_soft must be below memory_hard")
        if self.psi_soft is not None and self.psi_soft >= self.psi_hard:
            raise ValueError("psi_soft must be below psi_hard")
        return self


class WorkerSettings(BaseModel):
    """How a worker process runs jobs."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int = Field(
        default=50,
        ge=1,
        description="A worker's slots: jobs it runs at once, a job of slots=N taking N.",
    )
    lanes: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["default"],
        min_length=1,
        description='Lanes the worker serves; the environment may give "light,heavy".',
    )
    fetch_batch: int = Field(default=100, ge=1, description="Most jobs fetched in one round trip.")
    grace_period: float = Field(
        default=30.0, ge=0, description="Time running jobs get to finish on shutdown."
    )
    idle_block: float = Field(
        default=5.0, gt=0, description="Time an idle worker blocks on the server per wait."
    )
    health_port: int | None = Field(
        default=None, ge=0, le=65535, description="Port of the /health endpoint; None disables it."
    )
    loop_block_threshold: float = Field(
        default=2.0, gt=0, description="/health fails when the event loop lagged longer than this."
    )
    thread_pool_size: int = Field(default=32, ge=1, description="Threads for synchronous jobs.")
    process_pool_size: int = Field(
        default=0, ge=0, description="Processes for CPU-bound jobs; 0 means the number of CPUs."
    )
    pressure: PressureSettings = Field(
        default_factory=PressureSettings, description="Resource backpressure."
    )

    @field_validator("lanes", mode="before")
    @classmethod
    def _split_lanes(cls, value: object) -> object:
        """Accept a comma-separated string or a JSON list, as environment variables give."""
        if not isinstance(value, str):
            return value
        if value.lstrip().startswith("["):
            try:
                return json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"lanes is not a valid JSON list: {exc}") from exc
        return [lane.strip() for lane in value.split(",") if lane.strip()]

    @field_validator("lanes")
    @classmethod
    def _lanes_named(cls, value: list[str]) -> list[str]:
        if any(not lane.strip() for lane in value):
            raise ValueError("lane names must not be empty")
        return value


class ConnectionSettings(BaseModel):
    """How long a call waits for the server before it counts as unreachable."""

    model_config = ConfigDict(extra="forbid")

    connect_timeout: float = Field(
        default=2.0, gt=0, description="Time to open a connection to the server."
    )
    timeout: float = Field(
        default=5.0,
        gt=0,
        description="Time to wait for a reply; past it the call fails as unavailable "
        "(blocking waits get this on top of their block time).",
    )


class DurabilitySettings(BaseModel):
    """Acknowledged writes: after an enqueue, wait until replicas (WAIT) or append-only
    files (WAITAOF) hold it. The default asks nothing (the primary's memory only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: int = Field(
        default=0, ge=0, description="Replicas that must acknowledge an enqueue (WAIT)."
    )
    aof: bool = Field(
        default=False,
        description="The primary's AOF, and each counted replica's, must be fsynced (WAITAOF).",
    )
    timeout: float = Field(
        default=1.0, gt=0, description="Most time an enqueue waits for the acknowledgements."
    )

    @property
    def requested(self) -> bool:
        """Whether any acknowledgement is asked for."""
        return self.replicas > 0 or self.aof


class PayloadSettings(BaseModel):
    """Large payloads: arguments and results over a threshold kept in a payload store."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(
        default=None,
        description="Payload store shared by producers and workers: file:///shared/dir or "
        "s3://bucket/prefix?endpoint_url=...; None keeps every payload in the server.",
    )
    threshold_bytes: int = Field(
        default=65_536,
        ge=0,
        description="Arguments or results longer than this travel as a reference.",
    )
    max_bytes: int = Field(
        default=268_435_456, ge=1, description="Largest payload the payload store takes."
    )
    grace: float = Field(
        default=900.0,
        gt=0,
        description="Time before a new payload's job record is first looked for "
        "(its enqueue may still be in flight).",
    )
    recheck_interval: float = Field(
        default=300.0,
        gt=0,
        description="Time between checks of a payload whose job record exists; a payload "
        "outlives its record by up to this plus a sweep interval.",
    )
    sweep_batch: int = Field(
        default=500, ge=1, description="Payload index entries checked per sweep pass."
    )


class ServerSettings(BaseModel):
    """The local development server that Fairlane can start."""

    model_config = ConfigDict(extra="forbid")

    state_dir: Path | None = Field(
        default=None, description="Directory of the local dev server; None means the XDG state dir."
    )
    binary: str | None = Field(
        default=None, description="Server binary; None means the bundled one or one on PATH."
    )


@dataclass(frozen=True)
class _Context:
    project_dir: Path
    environ: Mapping[str, str]


_CONTEXT: ContextVar[_Context | None] = ContextVar("fairlane_config_context", default=None)


def _current_context() -> _Context:
    return _CONTEXT.get() or _Context(Path.cwd(), os.environ)


class Settings(BaseSettings):
    """All Fairlane settings. Prefer ``load_settings`` to building this directly."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="forbid",
        pyproject_toml_table_header=("tool", "fairlane"),
    )

    redis_url: str | None = Field(
        default=None,
        description="Redis/Valkey URL, e.g. redis://localhost:6379/0; None if not configured.",
    )
    max_payload_bytes: int = Field(
        default=1_048_576, ge=1, description="Largest accepted job payload, in bytes."
    )
    default_lane: str = Field(
        default="default", min_length=1, description="Lane of jobs that name none."
    )
    lanes_file: Path | None = Field(
        default=None,
        description="TOML file of lanes' service classes ([[lanes.<name>.classes]]); "
        "relative to the project directory.",
    )
    shards: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Scheduling shards of each app: tenants are spread over them by a "
        "stable hash; every process of an app must use the same count.",
    )
    lease: LeaseSettings = Field(default_factory=LeaseSettings, description="Job leases.")
    worker: WorkerSettings = Field(default_factory=WorkerSettings, description="Workers.")
    server: ServerSettings = Field(default_factory=ServerSettings, description="Dev server.")
    payloads: PayloadSettings = Field(
        default_factory=PayloadSettings, description="Large payloads."
    )
    connection: ConnectionSettings = Field(
        default_factory=ConnectionSettings, description="Server timeouts."
    )
    durability: DurabilitySettings = Field(
        default_factory=DurabilitySettings, description="Acknowledged enqueues."
    )

    @field_validator("lanes_file")
    @classmethod
    def _anchor_lanes_file(cls, value: Path | None) -> Path | None:
        """A relative path is the project's, wherever the process was started."""
        if value is None or value.is_absolute():
            return value
        return _current_context().project_dir / value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then ``FAIRLANE_`` env, then ``fairlane.toml``, then ``pyproject.toml``."""
        layers = _file_and_env_sources(settings_cls, _current_context())
        return (init_settings, *(source for _, source in layers))


class _FairlaneEnvSource(EnvSettingsSource):
    """The standard env source, reading a given mapping and refusing misspelt variables."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {(k if self.case_sensitive else k.lower()): v for k, v in self._environ.items()}

    def __call__(self) -> dict[str, Any]:
        _reject_misspelt_env(self.settings_cls, self._environ)
        return super().__call__()


def _read_toml(file_path: Any) -> dict[str, Any]:
    """Parse one settings file, naming it in any error."""
    try:
        with Path(file_path).open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML in {file_path}: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read {file_path}: {exc}") from exc


class _TomlSource(TomlConfigSettingsSource):
    """``fairlane.toml``: its top-level table is the settings."""

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        return _read_toml(file_path)


class _PyprojectSource(PyprojectTomlConfigSettingsSource):
    """The ``[tool.fairlane]`` table of ``pyproject.toml``."""

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        data = _read_toml(file_path)
        node: Any = data
        for key in self.toml_table_header:
            node = node.get(key, {})
            if not isinstance(node, dict):
                header = ".".join(self.toml_table_header)
                raise ConfigError(f"[{header}] in {file_path} must be a table")
        return data


def _file_and_env_sources(
    settings_cls: type[BaseSettings], ctx: _Context
) -> list[tuple[str, PydanticBaseSettingsSource]]:
    """The env and file sources, highest precedence first, each with its label."""
    return [
        ("env", _FairlaneEnvSource(settings_cls, ctx.environ)),
        (TOML_FILE, _TomlSource(settings_cls, toml_file=ctx.project_dir / TOML_FILE)),
        (PYPROJECT_LABEL, _PyprojectSource(settings_cls, ctx.project_dir / PYPROJECT_FILE)),
    ]


def _leaf_paths(model: type[BaseModel], parent: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every leaf setting of ``model``, in model order, as a path of field names."""
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _leaf_paths(annotation, (*parent, name))
        else:
            yield (*parent, name)


def _env_name(path: tuple[str, ...]) -> str:
    return ENV_PREFIX + ENV_NESTED_DELIMITER.join(path).upper()


def _reject_misspelt_env(settings_cls: type[BaseModel], environ: Mapping[str, str]) -> None:
    """Raise for ``FAIRLANE_`` variables that look like a setting but match none.

    Unknown keys under a known section (``FAIRLANE_LEASE__DURATON``) are left to pydantic's
    ``extra="forbid"``; this catches unknown sections and near misses at the top level.
    """
    top = {name.upper() for name in settings_cls.model_fields}
    spellings: dict[str, str] = {}
    for path in _leaf_paths(settings_cls):
        correct = _env_name(path)
        for spelling in ("_".join(path), path[-1], ENV_NESTED_DELIMITER.join(path)):
            spellings.setdefault(spelling.upper(), correct)
    for name in environ:
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX):
            continue
        rest = upper[len(ENV_PREFIX) :]
        if rest.split(ENV_NESTED_DELIMITER)[0] in top:
            continue
        close = difflib.get_close_matches(rest, list(spellings), n=1, cutoff=0.8)
        if close or ENV_NESTED_DELIMITER in rest:
            hint = f"; did you mean {spellings[close[0]]}?" if close else ""
            raise ConfigError(f"environment variable {name} is not a Fairlane setting{hint}")


@dataclass(frozen=True)
class _Layer:
    """One source's raw values, with a way to name the origin of a path within it."""

    data: dict[str, Any]
    label: Callable[[tuple[str, ...]], str]


def _as_data(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, Mapping):
        return {key: _as_data(item) for key, item in value.items()}
    return value


def _layers(ctx: _Context, overrides: Mapping[str, Any]) -> list[_Layer]:
    """Every non-default source evaluated on its own, highest precedence first."""
    layers = [_Layer(_as_data(overrides), lambda _path: "argument")]
    for label, source in _file_and_env_sources(Settings, ctx):
        if label == "env":
            layers.append(_Layer(source(), lambda path: "env " + _env_var_for(path, ctx.environ)))
        else:
            layers.append(_Layer(source(), _constant(label)))
    return layers


def _constant(label: str) -> Callable[[tuple[str, ...]], str]:
    return lambda _path: label


def _env_var_for(path: tuple[str, ...], environ: Mapping[str, str]) -> str:
    """The variable that set ``path``: the most specific one present, e.g. X__Y before X."""
    actual = {name.upper(): name for name in environ}
    for end in range(len(path), 0, -1):
        name = _env_name(path[:end])
        if name in actual:
            return actual[name]
    return _env_name(path)


def _lookup(data: Any, path: tuple[str, ...]) -> tuple[bool, Any]:
    """Whether ``path`` is set in ``data``; a non-table value on the way covers the rest."""
    for key in path:
        if not isinstance(data, dict):
            return True, data
        if key not in data:
            return False, None
        data = data[key]
    return True, data


def _flatten(data: Any, parent: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    if isinstance(data, dict) and data:
        for key, value in data.items():
            yield from _flatten(value, (*parent, str(key)))
    else:
        yield parent


def _origins_of(path: tuple[str, ...], layers: list[_Layer]) -> list[str]:
    """Sources that supplied the value at ``path`` (several if it is a merged table)."""
    found: list[str] = []
    for layer in layers:
        present, value = _lookup(layer.data, path)
        if not present:
            continue
        if not isinstance(value, dict):
            return [*found, layer.label(path)]
        for leaf in _flatten(value, path):
            found.append(layer.label(leaf))
    return list(dict.fromkeys(found))


def _describe(exc: ValidationError, layers: list[_Layer]) -> str:
    lines = ["invalid Fairlane settings:"]
    for error in exc.errors():
        path = tuple(str(part) for part in error["loc"])
        where = ".".join(path) or "settings"
        origins = _origins_of(path, layers) if path else []
        source = f" (from {', '.join(origins)})" if origins else ""
        value = error.get("input")
        given = "" if isinstance(value, dict | BaseModel) else f", got {value!r}"
        lines.append(f"  {where}: {error['msg']}{given}{source}")
    return "\n".join(lines)


def _context(project_dir: Path | str | None, environ: Mapping[str, str] | None) -> _Context:
    base = _current_context()
    return _Context(
        Path(project_dir) if project_dir is not None else base.project_dir,
        environ if environ is not None else base.environ,
    )


def _load(ctx: _Context, overrides: dict[str, Any]) -> Settings:
    token = _CONTEXT.set(ctx)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, _layers(ctx, overrides))) from exc
    except SettingsError as exc:
        cause = f": {exc.__cause__}" if exc.__cause__ else ""
        raise ConfigError(f"invalid Fairlane settings: {exc}{cause}") from exc
    finally:
        _CONTEXT.reset(token)


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
    return _load(_context(project_dir, environ), overrides)


@dataclass(frozen=True)
class SettingOrigin:
    """Where one leaf setting's value came from."""

    key: str
    """Dotted setting name, e.g. ``"lease.duration"``."""
    value: object
    """The value in force."""
    source: str
    """``"default"``, ``"argument"``, ``"env FAIRLANE_..."``, ``"fairlane.toml"`` or
    ``"pyproject.toml [tool.fairlane]"``."""


def explain_settings(
    *,
    project_dir: Path | str | None = None,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> list[SettingOrigin]:
    """Load settings like ``load_settings``; report each leaf's value and source in model order."""
    ctx = _context(project_dir, environ)
    settings = _load(ctx, overrides)
    layers = _layers(ctx, overrides)
    rows = []
    for path in _leaf_paths(Settings):
        value: Any = settings
        for key in path:
            value = getattr(value, key)
        source = "default"
        for layer in layers:
            if _lookup(layer.data, path)[0]:
                source = layer.label(path)
                break
        rows.append(SettingOrigin(".".join(path), value, source))
    return rows
