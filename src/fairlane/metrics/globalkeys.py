"""Global keys' metric families: a key shared by the shards of an app of many shards,
and each shard's part of it (``fairlane.policy.globalkeys``), read at the scrape from
the store's read model (``fairlane.store.views.globalkeys``), the figures the balancer
reads:

- ``fairlane_global_key_limit{key}``: its concurrency limit (a key of rates only has
  none);
- ``fairlane_global_key_part{key,shard}``: the shard's part in force, in ``[0, 1]``;
- ``fairlane_global_key_held_slots{key,shard}``: the slots the shard holds: its part's,
  or more while more run than it (a part just lowered leaves its running jobs to end);
- ``fairlane_global_key_used_slots{key,shard}``: slots held by running jobs and offered
  to woken ones;
- ``fairlane_global_key_waiting{key,shard}`` and
  ``fairlane_global_key_waiting_weight{key,shard}``: the jobs parked on it in the shard
  and the weights of their tenants, which the balancer shares the key by;
- ``fairlane_global_keys``: the global keys the shards list.

**Bounded labels.** ``shard`` takes the app's shard count of values. ``key`` is bounded
as the rate keys' is (``fairlane.metrics.rates``): the ``top_n`` keys by slots used
and jobs waiting get a label of their own, and the use, waiters and weight of the
others are summed under ``other``; limits, parts and held slots are exported for the
labelled keys only.

A worker that runs the balancer exports its passes (``BalancerCollector``):
``fairlane_global_key_balancer_passes_total`` (passes this worker ran while it led)
and, of the last, ``fairlane_global_key_balancer_last_pass_orders{step}`` (``lower``,
``raise``) and ``fairlane_global_key_balancer_last_pass_keys``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fairlane.metrics.tenants import OTHER
from fairlane.runtime.balancer import KeyBalancer
from fairlane.store.views.globalkeys import GlobalKeys, GlobalKeyView

__all__ = ["BalancerCollector", "global_key_families", "labelled_global_keys"]


def labelled_global_keys(views: Sequence[GlobalKeyView], top_n: int) -> frozenset[str]:
    """The ``top_n`` keys most in use and most waited for (ties by name)."""
    top = heapq.nsmallest(top_n, views, key=lambda v: (-(v.used + v.waiting), v.key))
    return frozenset(v.key for v in top)


def _gauge(name: str, doc: str, labels: Sequence[str] = ("key", "shard")) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def global_key_families(keys: GlobalKeys, top_n: int) -> Iterator[Metric]:
    """The global keys' families; ``key`` labels bounded to ``top_n`` keys and ``other``."""
    if not keys.enabled:
        return
    known = GaugeMetricFamily("fairlane_global_keys", "Global keys the app's shards list.")
    known.add_metric([], keys.known)
    yield known
    own = labelled_global_keys(keys.keys, top_n)
    limit = _gauge("fairlane_global_key_limit", "A global key's concurrency limit.", ("key",))
    part = _gauge("fairlane_global_key_part", "A shard's part of a global key, in [0, 1].")
    held = _gauge(
        "fairlane_global_key_held_slots",
        "Slots of a global key a shard holds: its part's, or more while more run.",
    )
    summed = {
        "used": _gauge(
            "fairlane_global_key_used_slots",
            "Slots of a global key a shard's running jobs hold (and offers to woken jobs).",
        ),
        "waiting": _gauge("fairlane_global_key_waiting", "Jobs parked on a global key in a shard."),
        "weight": _gauge(
            "fairlane_global_key_waiting_weight",
            "The weights of the tenants waiting on a global key in a shard.",
        ),
    }
    other: dict[tuple[str, int], float] = {}
    for view in keys.keys:
        mine = view.key in own
        if mine and view.limit is not None:
            limit.add_metric([view.key], view.limit)
        for p in view.parts:
            values = {"used": float(p.used), "waiting": float(p.waiting), "weight": p.weight}
            if not mine:
                for name, value in values.items():
                    other[(name, p.shard)] = other.get((name, p.shard), 0.0) + value
                continue
            shard = str(p.shard)
            part.add_metric([view.key, shard], p.part)
            if p.held is not None:
                held.add_metric([view.key, shard], p.held)
            for name, family in summed.items():
                family.add_metric([view.key, shard], values[name])
    for (name, index), value in sorted(other.items()):
        summed[name].add_metric([OTHER, str(index)], value)
    yield from (limit, part, held, *summed.values())


class BalancerCollector(Collector):
    """The passes of a worker's global-key balancer (``runtime/balancer.py``)."""

    def __init__(self, balancer: KeyBalancer) -> None:
        self.balancer = balancer

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        passes = CounterMetricFamily(
            "fairlane_global_key_balancer_passes",
            "Global-key balancer passes this worker ran while it led.",
        )
        passes.add_metric([], self.balancer.passes)
        yield passes
        last = self.balancer.last
        if last is None:
            return
        orders = GaugeMetricFamily(
            "fairlane_global_key_balancer_last_pass_orders",
            "Orders the last pass sent: lowers (and pauses carried) and raises.",
            labels=["step"],
        )
        orders.add_metric(["lower"], last.lowered)
        orders.add_metric(["raise"], last.raised)
        keys = GaugeMetricFamily(
            "fairlane_global_key_balancer_last_pass_keys",
            "Global keys the shards reported to the last pass.",
        )
        keys.add_metric([], last.keys)
        yield from (orders, keys)
