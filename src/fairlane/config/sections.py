"""The sections of Fairlane's settings: leases, workers and their backpressure, the
server connection, acknowledged writes, large payloads, the dev server, and the bounds
on queued jobs.

This module owns each section's fields, their defaults, bounds and descriptions (each
field's docstring, which an editor shows; they are not read at run time, as extracting
them costs every process that imports Fairlane about 40 ms), and the checks that tie a
section's fields together (a lease is renewed before it expires, a soft threshold sits
below its hard one). The whole model, its sources and its loading are
``fairlane.config.settings``. All durations are seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fairlane.config.sources import NoDecode
from fairlane.config.units import parse_size
from fairlane.policy.admission.bounds import (
    DEFAULT_LANE_MAX_QUEUED,
    DEFAULT_TENANT_MAX_QUEUED,
    QueueBounds,
)
from fairlane.policy.admission.memory import DEFAULT_MEMORY_MARK

__all__ = [
    "ConnectionSettings",
    "DurabilitySettings",
    "LeaseSettings",
    "PayloadSettings",
    "PressureSettings",
    "QueueSettings",
    "ServerSettings",
    "WorkerSettings",
]


class LeaseSettings(BaseModel):
    """How long a running job is leased to its worker, and how expired leases are reclaimed."""

    model_config = ConfigDict(extra="forbid")

    duration: float = Field(default=30.0, gt=0)
    """Lease length of a running job."""
    renew_interval: float = Field(default=10.0, gt=0)
    """How often a worker renews its leases; must be below duration."""
    sweep_interval: float = Field(default=5.0, gt=0)
    """Period of the expired-lease sweep."""
    sweep_jitter: float = Field(default=0.25, ge=0, le=1)
    """Random spread of the sweep period, as a fraction (0..1)."""
    sweep_batch: int = Field(default=200, ge=1)
    """Most jobs reclaimed in one sweep pass."""
    heartbeat_interval: float = Field(default=1.0, gt=0)
    """How often a worker beats, from a thread of its own (a blocked event loop does not stop
    it): one call per shard, however many jobs it runs."""
    worker_timeout: float = Field(default=3.0, gt=0)
    """A worker that beat and then stays silent this long is dead: the other workers take
    its jobs back at once (at their next beat), not when its leases run out."""

    @model_validator(mode="after")
    def _renew_before_expiry(self) -> Self:
        if self.renew_interval >= self.duration:
            raise ValueError(
                f"renew_interval ({self.renew_interval}) must be less than "
                f"duration ({self.duration}), or leases expire before they are renewed"
            )
        if self.heartbeat_interval >= self.worker_timeout:
            raise ValueError(
                f"heartbeat_interval ({self.heartbeat_interval}) must be less than "
                f"worker_timeout ({self.worker_timeout}), or live workers look dead"
            )
        return self


class PressureSettings(BaseModel):
    """How a worker holds back under resource pressure (``fairlane.runtime.pressure``)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    """Watch memory, CPU and pressure stalls; fetch less under them."""
    interval: float = Field(default=0.5, gt=0)
    """Time between sensor readings."""
    memory_limit: int | None = Field(default=None, gt=0)
    """Bytes (or "2GiB", "512m") the worker and its children may use; None: the container's cgroup
    limit, else the machine's RAM."""
    memory_soft: float = Field(default=0.8, gt=0, le=1)
    """Share of the limit above which fewer slots fill."""
    memory_hard: float = Field(default=0.9, gt=0, le=1)
    """Share of the limit at which no new work is taken."""
    cpu_soft: float | None = Field(default=None, ge=0, lt=1)
    """Machine CPU busy share (0..1) above which fewer slots fill; None: off."""
    psi_soft: float | None = Field(default=None, ge=0, le=100)
    """Stall percent (PSI some avg10) above which fewer slots fill; None: off."""
    psi_hard: float = Field(default=90.0, ge=0, le=100)
    """Stall percent at which the fewest slots fill."""
    min_fraction: float = Field(default=0.25, ge=0, le=1)
    """Fewest slots filled under pressure, as a share."""
    recovery: float = Field(default=0.5, gt=0)
    """Share of the slots regained per second as pressure eases."""

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

    concurrency: int = Field(default=50, ge=1)
    """A worker's slots: jobs it runs at once, a job of slots=N taking N."""
    lanes: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["default"], min_length=1)
    """Lanes the worker serves; the environment may give "light,heavy"."""
    fetch_batch: int = Field(default=100, ge=1)
    """Most jobs fetched in one round trip."""
    grace_period: float = Field(default=30.0, ge=0)
    """Time running jobs get to finish on shutdown."""
    idle_block: float = Field(default=5.0, gt=0)
    """Time an idle worker blocks on the server per wait."""
    health_port: int | None = Field(default=None, ge=0, le=65535)
    """Port of the /health endpoint; None disables it."""
    loop_block_threshold: float = Field(default=2.0, gt=0)
    """/health fails when the event loop lagged longer than this."""
    thread_pool_size: int = Field(default=32, ge=1)
    """Threads for synchronous jobs."""
    process_pool_size: int = Field(default=0, ge=0)
    """Processes for CPU-bound jobs; 0 means the number of CPUs."""
    deploy_window: float = Field(default=300.0, ge=0)
    """A job this worker cannot run (its task unknown here, or arguments that do not fit the
    task's signature: a producer or worker on another version) is handed back for another
    worker until this long after its first hand-back, then dead-lettered; 0: at once."""
    handback_delay: float = Field(default=5.0, gt=0)
    """A job handed back is due again after this long, for any worker to take."""
    pressure: PressureSettings = Field(default_factory=PressureSettings)
    """Resource backpressure."""

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
    """How long a call waits for the server before it counts as unreachable, and how
    many calls of a process use it at once."""

    model_config = ConfigDict(extra="forbid")

    connect_timeout: float = Field(default=2.0, gt=0)
    """Time to open a connection to the server."""
    timeout: float = Field(default=5.0, gt=0)
    """Time to wait for a reply; past it the call fails as unavailable (blocking waits get this on
    top of their block time). A call that finds every connection in use waits as long for one,
    then fails as busy."""
    max_connections: int = Field(default=64, ge=1)
    """Calls of one process on the server at once (per kind: quick calls, and blocking waits);
    more wait their turn, first come first served."""


class DurabilitySettings(BaseModel):
    """Acknowledged writes: after an enqueue, wait until replicas (WAIT) or append-only
    files (WAITAOF) hold it. The default asks nothing (the primary's memory only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: int = Field(default=0, ge=0)
    """Replicas that must acknowledge an enqueue (WAIT)."""
    aof: bool = False
    """The primary's AOF, and each counted replica's, must be fsynced (WAITAOF)."""
    timeout: float = Field(default=1.0, gt=0)
    """Most time an enqueue waits for the acknowledgements."""

    @property
    def requested(self) -> bool:
        """Whether any acknowledgement is asked for."""
        return self.replicas > 0 or self.aof


class PayloadSettings(BaseModel):
    """Large payloads: arguments and results over a threshold kept in a payload store."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = None
    """Payload store shared by producers and workers: file:///shared/dir or
    s3://bucket/prefix?endpoint_url=...; None keeps every payload in the server."""
    threshold_bytes: int = Field(default=65_536, ge=0)
    """Arguments or results longer than this travel as a reference."""
    max_bytes: int = Field(default=268_435_456, ge=1)
    """Largest payload the payload store takes."""
    grace: float = Field(default=900.0, gt=0)
    """Time before a new payload's job record is first looked for (its enqueue may still be in
    flight)."""
    recheck_interval: float = Field(default=300.0, gt=0)
    """Time between checks of a payload whose job record exists; a payload outlives its record by up
    to this plus a sweep interval."""
    sweep_batch: int = Field(default=500, ge=1)
    """Payload index entries checked per sweep pass."""


class QueueSettings(BaseModel):
    """Bounds on the jobs waiting in a lane without an admission pool, the default lane
    included (a lane with a pool keeps its pool's bounds; ``fairlane.policy.admission
    .bounds`` says what counts). A submission past one is refused with
    ``Rejected("tenant_queue_full" | "lane_queue_full", retry_after)``. And the store's
    memory mark, which bounds every lane: above it, ``Rejected("store_full",
    retry_after)`` (``fairlane.policy.admission.memory``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant_max_queued: int | None = Field(default=DEFAULT_TENANT_MAX_QUEUED, ge=1)
    """Most jobs a tenant may have ready in one class queue of a lane; None (or "none")
    lifts the bound."""
    lane_max_queued: int | None = Field(default=DEFAULT_LANE_MAX_QUEUED, ge=1)
    """Most jobs ready in a lane (slots, a job of slots=N counting N), and ready plus
    scheduled for a new scheduled job; split over the scheduling shards; None (or
    "none") lifts the bound."""

    memory_high_water: float | None = Field(default=DEFAULT_MEMORY_MARK, gt=0, le=1)
    """The share of the server's ``maxmemory`` above which new jobs are refused
    ``store_full``; None (or "none") turns the mark off. A server without maxmemory
    has no mark."""

    @field_validator("tenant_max_queued", "lane_max_queued", "memory_high_water", mode="before")
    @classmethod
    def _none_spelt(cls, value: object) -> object:
        """TOML has no null and the environment only strings: "none" lifts a bound."""
        if isinstance(value, str) and value.strip().lower() in ("none", "null", "unbounded"):
            return None
        return value

    @property
    def bounds(self) -> QueueBounds:
        """The bounds as the policy states them."""
        return QueueBounds(self.tenant_max_queued, self.lane_max_queued)


class ServerSettings(BaseModel):
    """The local development server that Fairlane can start."""

    model_config = ConfigDict(extra="forbid")

    state_dir: Path | None = None
    """Directory of the local dev server; None means the XDG state dir."""
    binary: str | None = None
    """Server binary; None means the bundled one or one on PATH."""
