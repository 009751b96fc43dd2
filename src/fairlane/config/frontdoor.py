"""The ``front_door`` section of Fairlane's settings: the HTTP gateway's bounds per tenant.

Each gateway process holds these bounds in its own memory and checks them before a
request touches the store (``fairlane.gateway.frontdoor``): a tenant's requests in
flight, its submissions per second (a token bucket), and the seats (the calls on the
store at once) its requests share fairly with other tenants'; and how long the answer
to a refusal ignored is held back. The defaults are far above what one well-behaved
client asks of one process; ``tenants`` narrows (or lifts) them for a tenant by name.
With ``fairlane gateway --workers N``, each of the N processes holds its own buckets
and seats, so a tenant may get N times the rate.

``"none"`` lifts a bound (TOML has no null). In a file::

    [front_door]
    tenant_rate = 200          # submits/s per tenant and process
    [front_door.tenants.acme]
    rate = 20
    burst = 40
    max_in_flight = 8

or ``FAIRLANE_FRONT_DOOR__TENANTS='{"acme": {"rate": 20}}'``.
"""

from __future__ import annotations

import msgspec
from pydantic import BaseModel, ConfigDict, Field, field_validator

from fairlane.policy.rates import Rate

__all__ = ["DoorBounds", "FrontDoorSettings", "TenantBounds"]

_LIFTED = ("none", "null", "unbounded")


def _none_spelt(value: object) -> object:
    if isinstance(value, str) and value.strip().lower() in _LIFTED:
        return None
    return value


class DoorBounds(msgspec.Struct, frozen=True):
    """One tenant's bounds as the front door applies them (None: no bound)."""

    max_in_flight: int | None
    rate: Rate | None


def _rate(per_second: float | None, burst: float | None) -> Rate | None:
    if per_second is None:
        return None
    # a burst below one job could never admit one: a slow rate bursts to one submit
    return Rate(per_second, 1.0, burst if burst is not None else max(1.0, per_second))


class TenantBounds(BaseModel):
    """One tenant's own bounds; a field left out keeps the section's default for it,
    and ``"none"`` lifts that bound for the tenant."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_in_flight: int | None = Field(default=None, ge=1)
    """Requests of the tenant in one gateway process at once."""
    rate: float | None = Field(default=None, gt=0)
    """Submits per second the tenant's bucket refills with."""
    burst: float | None = Field(default=None, ge=1)
    """Submits the tenant's bucket holds (the most at once after a quiet spell)."""

    _none = field_validator("max_in_flight", "rate", mode="before")(_none_spelt)


class FrontDoorSettings(BaseModel):
    """The HTTP gateway's bounds per tenant, checked in each gateway process before a
    request touches the store; past one, a request is answered 429 with Retry-After."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant_max_in_flight: int | None = Field(default=100, ge=1)
    """Requests of one tenant in one gateway process at once (answered or waiting for a
    seat); past it, 429 tenant_in_flight. None (or "none") lifts the bound."""
    tenant_rate: float | None = Field(default=1000.0, gt=0)
    """Submits (POST /v1/jobs) per second of one tenant in one gateway process, a token
    bucket refilled at this rate; past it, 429 tenant_rate with the wait for the next
    token as Retry-After. None (or "none") lifts the bound."""
    tenant_burst: float | None = Field(default=None, ge=1)
    """Submits a tenant's bucket holds; None: one second's worth (at least one)."""
    tenants: dict[str, TenantBounds] = Field(default_factory=dict)
    """Bounds of named tenants, each field overriding the default above."""
    seats: int = Field(default=8, ge=1)
    """Tenants' requests using the store at once (at most connection.max_connections, so the
    store's own call gate never makes them wait), shared fairly between tenants: a seat
    given back goes to the waiting tenant that holds the fewest. A gateway process is
    bound by its CPU; more requests in progress only make each take longer. Raise it for
    a store far away or acknowledged writes (durability), whose calls take longer."""
    lag_target: float | None = Field(default=0.001, gt=0)
    """The event loop's lag (seconds) the door is governed to (``gateway/governor.py``):
    past it a seat fewer each 50 ms, under half of it a seat more, between one and
    ``seats``; at one seat and still past it, with two tenants or more submitting, the
    largest is held to a max-min fair rate (429 tenant_rate). None keeps ``seats`` fixed
    and sheds nothing. A saturated loop makes every request in progress slower, a quiet
    tenant's too."""
    waiting: int = Field(default=1000, ge=0)
    """Requests that may wait for a seat; when one more comes, a waiting request of the
    tenant that holds and waits for the most is answered 429 gateway_busy."""
    seat_wait: float = Field(default=2.0, gt=0)
    """Longest wait for a seat; past it, 429 gateway_busy."""
    refusal_hold: float = Field(default=1.0, ge=0)
    """A tenant refused again before the Retry-After it was given has run out gets its
    429 after this long (half to all of it, spread); 0 answers at once. A client that
    ignores Retry-After then costs the gateway about one refusal per hold and
    connection, not one per round trip."""

    _none = field_validator("tenant_max_in_flight", "tenant_rate", "lag_target", mode="before")(
        _none_spelt
    )

    def bounds_of(self, tenant: str) -> DoorBounds:
        """The bounds of ``tenant``: its own where given, the defaults elsewhere."""
        return self._bounds(self.tenants.get(tenant))

    def default_bounds(self) -> DoorBounds:
        """The bounds of a tenant not named in ``tenants``."""
        return self._bounds(None)

    def _bounds(self, own: TenantBounds | None) -> DoorBounds:
        given = own.model_fields_set if own is not None else set()

        def pick(name: str, default: float | None) -> float | None:
            return getattr(own, name) if name in given else default

        in_flight = pick("max_in_flight", self.tenant_max_in_flight)
        # a tenant's own rate bursts to its own second's worth unless it says otherwise
        burst = pick("burst", None if "rate" in given else self.tenant_burst)
        rate = _rate(pick("rate", self.tenant_rate), burst)
        return DoorBounds(None if in_flight is None else int(in_flight), rate)
