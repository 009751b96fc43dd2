"""The ``tenants`` section of Fairlane's settings: how long what a tenant leaves behind is kept.

This module owns the section's fields, defaults and bounds; the rules they feed are
``fairlane.policy.tenantstate`` and the worker's sweep is ``fairlane.runtime.tenant_sweep``.
Durations are seconds, or a string such as ``"90s"``, ``"12h"``, ``"7d"``
(``FAIRLANE_TENANTS__IDLE_TTL=7d``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fairlane.policy.retention import parse_duration
from fairlane.policy.tenantstate import DEFAULT_IDLE_TTL

__all__ = ["TenantSettings"]


class TenantSettings(BaseModel):
    """What the store keeps of tenants that have gone quiet."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    idle_ttl: float = Field(default=DEFAULT_IDLE_TTL, gt=0)
    """Time a tenant may be idle before its learned costs, signals and finish tags are
    forgotten (it comes back as a new tenant, from the default estimate); e.g. "7d"."""
    sweep_interval: float = Field(default=60.0, gt=0)
    """Period of the tenant sweep in each worker; e.g. "1m"."""
    sweep_batch: int = Field(default=500, ge=1, le=10_000)
    """Most keys and fields one sweep pass looks at."""

    @field_validator("idle_ttl", "sweep_interval", mode="before")
    @classmethod
    def _parse_duration(cls, value: object) -> object:
        if isinstance(value, str):
            return parse_duration(value)
        return value
