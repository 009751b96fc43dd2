"""``MetricsConfig``: how a worker's metrics endpoint labels tenants and where it binds."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

__all__ = ["MetricsConfig"]


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """Options of the metrics endpoint (the port is passed on its own: ``metrics_port``).

    ``tenants``: tenants that always get their own ``tenant`` label. ``top_n``: how many
    other tenants, the busiest by jobs started on this worker, get one too; every other
    tenant is labelled ``other``. ``host``: the address to bind (all interfaces by
    default, for Prometheus to reach). ``store_timeout`` bounds the scrape-time read
    of the store; ``store_max_age`` is how long one read is reused (at most one read
    per that many seconds, however often the endpoint is scraped). ``key_top_n``: how
    many rate keys, those that took the most tokens, get a ``key`` label of their own;
    the others are summed under ``other`` (``fairlane.metrics.rates``). ``horizon``:
    seconds the backlog outside batch classes is to clear in, for ``/autoscale``'s
    ``slots_needed_horizon`` (``fairlane.policy.capacityneed``); None: the app's
    ``autoscale_horizon`` setting.
    """

    tenants: frozenset[str] = field(default_factory=frozenset)
    top_n: int = 20
    host: str = "0.0.0.0"  # all interfaces: a metrics endpoint is meant to be scraped
    store_timeout: float = 1.0
    store_max_age: float = 2.0
    sample_interval: float = 1.0
    key_top_n: int = 20
    horizon: float | None = None

    def __post_init__(self) -> None:
        if self.top_n < 0:
            raise ValueError(f"top_n must be >= 0, got {self.top_n}")
        if self.key_top_n < 0:
            raise ValueError(f"key_top_n must be >= 0, got {self.key_top_n}")
        if self.horizon is not None and not self.horizon > 0:
            raise ValueError(f"horizon must be > 0 seconds, got {self.horizon}")

    def with_horizon(self, default: float) -> MetricsConfig:
        """These options, with ``default`` as the horizon unless one is set."""
        return self if self.horizon is not None else replace(self, horizon=default)
