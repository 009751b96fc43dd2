"""Prometheus metrics served by a worker (and, for the store side, by the HTTP gateway:
``fairlane.gateway.metrics``): what this package owns and where.

- ``config``: ``MetricsConfig``, the knobs (tenant allow-list, top-N, bind host).
- ``tenants``: ``TenantLabels``, which keeps the ``tenant`` label bounded.
- ``recorder``: ``WorkerMetrics``, the worker-side histograms, counters and gauges,
  recorded on the worker's own path with no server calls, and ``MetricsHooks``, the
  plug-in that gives a worker its recorder and endpoint (``fairlane.runtime.hooks``).
- ``store``: ``StoreReader`` and ``StoreCollector``, the store-side gauges and counters
  read at scrape time (pipelined reads, bounded timeout, cached), admission decisions
  counted by the server and the oldest waiting job's age.
- ``rates``: the rate keys' families (tokens admitted, refunded, charged as debt,
  pushbacks, time waited, the adaptive limit), ``key`` labels bounded to the top N.
- ``pressure``: ``PressureCollector``, a worker's resource-pressure allowance and
  sensor readings (``fairlane.runtime.pressure``) as gauges.
- ``server``: ``MetricsServer``, the HTTP endpoint (``/metrics`` and ``/autoscale``)
  in its own thread.
"""

from importlib import import_module
from typing import TYPE_CHECKING

from fairlane.metrics.config import MetricsConfig
from fairlane.metrics.tenants import OTHER, TenantLabels

if TYPE_CHECKING:
    from fairlane.metrics.recorder import MetricsHooks, WorkerMetrics
    from fairlane.metrics.server import MetricsServer
    from fairlane.metrics.store import StoreCollector, StoreReader, StoreSnapshot

# prometheus_client and the collectors are imported when first named, not with the
# package: a worker without a metrics port never needs them, and they are a tenth of
# its start-up (tests/budgets/test_import_budget.py)
_LAZY = {
    "MetricsHooks": "recorder",
    "WorkerMetrics": "recorder",
    "MetricsServer": "server",
    "StoreCollector": "store",
    "StoreReader": "store",
    "StoreSnapshot": "store",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)


__all__ = [
    "OTHER",
    "MetricsConfig",
    "MetricsHooks",
    "MetricsServer",
    "StoreCollector",
    "StoreReader",
    "StoreSnapshot",
    "TenantLabels",
    "WorkerMetrics",
]
