"""``PressureCollector``: a worker's resource pressure as Prometheus gauges.

The gauge itself (``fairlane.runtime.pressure.PressureGauge``) is the runtime's: it
samples the sensors and decides how many slots the worker may fill. This collector
only reads its latest allowance and readings, at scrape time, in the metrics server's
thread; ``MetricsHooks`` registers it when the worker has a gauge.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fairlane.runtime.pressure import PressureGauge

__all__ = ["PressureCollector"]


class PressureCollector(Collector):
    """Prometheus gauges of a worker's pressure: its allowance and every reading."""

    def __init__(self, gauge: PressureGauge) -> None:
        self.gauge = gauge

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        gauge = self.gauge
        target = GaugeMetricFamily(
            "fairlane_worker_pressure_target_slots",
            "Slots the worker may fill under resource pressure (0: it takes no new work).",
        )
        target.add_metric([], gauge.target())
        yield target
        readings = GaugeMetricFamily(
            "fairlane_worker_pressure_reading",
            "The worker's latest sensor readings (memory as a share of its limit, PSI in %).",
            labels=["sensor"],
        )
        for r in gauge.readings:
            readings.add_metric([r.name], r.value)
        yield readings
