"""Shared pieces of the metrics tests: Prometheus text parsed into samples, looked up by
name and labels, and a store scrape through a real ``StoreReader``."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fairlane import App
from fairlane.metrics import StoreCollector, StoreReader

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        v for got, v in samples.get(name, []) if all(got.get(k) == x for k, x in labels.items())
    )


def series(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """``name``'s samples keyed by their sorted labels."""
    return {tuple(sorted(got.items())): v for got, v in samples.get(name, [])}


def store_reader(app: App, redis_url: str, **options: int) -> StoreReader:
    """A reader of ``app``'s lanes that never reuses a read (``max_age`` 0)."""
    lanes = [*app.lanes, *(t.options.lane for t in app.tasks.values())]
    return StoreReader(redis_url, app.name, lanes, max_age=0.0, tables=app.lanes, **options)


async def scrape_store(reader: StoreReader) -> Samples:
    """The store-side metrics as Prometheus would see them (read in a thread)."""
    registry = CollectorRegistry()
    registry.register(StoreCollector(reader))
    return parse((await asyncio.to_thread(generate_latest, registry)).decode())
