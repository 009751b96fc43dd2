"""Histogram families kept in plain Python: the worker records into them on its own loop,
and they become Prometheus families at scrape time.

A series holds non-cumulative bucket counts and a sum; no lock per observation (the
worker's loop is the only writer), where prometheus_client's own histograms take one per
bucket. The bucket bounds of the worker's histograms are here too.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client.core import HistogramMetricFamily

__all__ = [
    "DURATION_BUCKETS",
    "RETRY_DELAY_BUCKETS",
    "SATURATION_BUCKETS",
    "UNIT_BUCKETS",
    "WAIT_BUCKETS",
    "Histogram",
    "Histograms",
]


#: Queue wait: from a few ms (an idle fleet) to an hour (a deep backlog).
WAIT_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip
DURATION_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip
RETRY_DELAY_BUCKETS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)
UNIT_BUCKETS = (0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 50.0, 100.0, 1000.0)
SATURATION_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)


def _le(bound: float) -> str:
    """A bucket bound as Prometheus writes it (as prometheus_client does: 0.5, 60.0, +Inf)."""
    return "+Inf" if bound == math.inf else repr(float(bound))


class Histogram:
    """One histogram series: non-cumulative bucket counts and the sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value


class Histograms:
    """A histogram family: label values -> series."""

    def __init__(self, name: str, doc: str, labels: Sequence[str], bounds: Sequence[float]) -> None:
        self.name, self.doc, self.labels = name, doc, list(labels)
        self.bounds = tuple(float(b) for b in bounds)
        self._les = [_le(b) for b in (*self.bounds, math.inf)]
        self.series: dict[tuple[str, ...], Histogram] = {}

    def child(self, *key: str) -> Histogram:
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = Histogram(self.bounds)
        return series

    def family(self) -> HistogramMetricFamily:
        out = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for key, series in list(self.series.items()):
            counts, running, buckets = list(series.counts), 0, []
            for le, n in zip(self._les, counts, strict=True):
                running += n
                buckets.append((le, float(running)))
            out.add_metric(list(key), buckets, series.total)
        return out
