"""Reading a scenario's throttle keys: ``[[keys]]`` (limits, adaptive limits, rates and
upstreams) and the keys a ``[[tenants]]`` entry names.

The format and its rules are ``fairlane.sim.parse``'s docstring; errors name the file
and the key path (``fairlane.sim.tables``).
"""

from __future__ import annotations

from fairlane.policy.rates import Adaptive, Rate
from fairlane.sim.scenario import KeySpec, UpstreamSpec
from fairlane.sim.tables import Table

__all__ = ["parse_keys", "tenant_keys"]

_KEY = ("name", "limit", "adaptive", "rate", "upstream")
_RATE = ("limit", "per", "burst", "cost")
_UPSTREAM = ("rps", "rps_burst", "tpm", "tpm_burst", "retry_step", "reject_time")


def parse_keys(top: Table) -> dict[str, KeySpec]:
    keys: dict[str, KeySpec] = {}
    for i, body in enumerate(top.array("keys")):
        k = Table(body, f"keys[{i}]", top.source, _KEY)
        name = k.string("name")
        if name.startswith("tenant:"):
            raise k.error("name", f"{name!r}: tenant:<name> is each tenant's own key")
        if name in keys:
            raise k.error("name", f"key {name!r} is declared twice")
        if not {"limit", "adaptive", "rate"} & set(k.data):
            raise k.error(
                "limit",
                "is required (the most jobs naming the key that run at once), unless the key "
                "has an adaptive limit or a rate",
            )
        if "limit" in k.data and "adaptive" in k.data:
            raise k.error("adaptive", "a key's concurrency limit is limit or adaptive, not both")
        limit = k.integer("limit", 1, low=1) if "limit" in k.data else None
        keys[name] = KeySpec(
            name,
            limit,
            rate=_rate(k) if "rate" in k.data else None,
            adaptive=_adaptive(k) if "adaptive" in k.data else None,
            upstream=_upstream(k) if "upstream" in k.data else None,
        )
    return keys


def _rate(k: Table) -> Rate:
    r = Table(k.data["rate"], k.at("rate"), k.source, _RATE)
    if "limit" not in r.data:
        raise r.error("limit", "is required (at most this many per `per` seconds)")
    cost = r.data.get("cost", "jobs")
    if cost not in ("jobs", "units"):
        raise r.error("cost", f"must be jobs or units, got {cost!r}")
    burst = r.number("burst", 1.0, positive=True) if "burst" in r.data else None
    try:
        return Rate(
            r.number("limit", 1.0, positive=True), r.number("per", 1.0, positive=True), burst,
            cost,
        )  # fmt: skip
    except ValueError as exc:
        raise r.error("", str(exc)) from None


def _adaptive(k: Table) -> Adaptive:
    a = Table(k.data["adaptive"], k.at("adaptive"), k.source, ("max", "min"))
    if "max" not in a.data:
        raise a.error("max", "is required (the limit it starts at)")
    high = a.integer("max", 1, low=1)
    low = a.integer("min", 1, low=1, high=high)
    return Adaptive(high, low)


def _upstream(k: Table) -> UpstreamSpec:
    u = Table(k.data["upstream"], k.at("upstream"), k.source, _UPSTREAM)
    if "rps" not in u.data and "tpm" not in u.data:
        raise u.error("", "needs rps (calls per second) or tpm (tokens per minute), or both")
    for key in ("rps_burst", "tpm_burst"):
        if key in u.data and key[:3] not in u.data:
            raise u.error(key, f"applies with {key[:3]}")

    def bucket(key: str, per: float, jobs: bool) -> Rate | None:
        if key not in u.data:
            return None
        burst = u.number(f"{key}_burst", 1.0, positive=True) if f"{key}_burst" in u.data else None
        try:
            return Rate(u.number(key, 1.0, positive=True), per, burst, "jobs" if jobs else "units")
        except ValueError as exc:
            raise u.error(key, str(exc)) from None

    return UpstreamSpec(
        rps=bucket("rps", 1.0, True),
        tpm=bucket("tpm", 60.0, False),
        retry_step=u.number("retry_step", 1.0),
        reject_time=u.number("reject_time", 0.01),
    )


def tenant_keys(t: Table, keys: dict[str, KeySpec]) -> tuple[str, ...]:
    names = t.array("keys")
    for j, name in enumerate(names):
        if name not in keys:
            declared = ", ".join(keys) or "none"
            raise t.error(f"keys[{j}]", f"no [[keys]] entry named {name!r} (declared: {declared})")
    if len(set(names)) != len(names):
        raise t.error("keys", f"names a key twice: {names}")
    calls = [name for name in names if keys[name].upstream is not None]
    if len(calls) > 1:
        raise t.error("keys", f"names two keys with an upstream ({calls}); a job calls one")
    units = t.number("units", 1.0)
    for j, name in enumerate(names):
        rate = keys[name].rate
        if rate is not None and rate.units and units > rate.capacity:
            raise t.error(
                f"keys[{j}]",
                f"its jobs' units ({units:g}) exceed key {name!r}'s burst ({rate.capacity:g}): "
                "they could never fit",
            )
    return tuple(names)
