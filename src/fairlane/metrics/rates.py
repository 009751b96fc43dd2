"""Rate keys' metric families, from the store's rate-key read model at scrape time.

Counted by the server, in each key's ``rate:<key>`` hash (``fairlane.store.views.rates``),
so every process that scrapes the store exports the same totals:

- ``fairlane_rate_tokens_admitted_total{key}``: tokens taken (jobs, or work units);
- ``fairlane_rate_tokens_refunded_total{key}``: tokens given back (a job that used
  less than it took, an offer given back);
- ``fairlane_rate_tokens_debt_total{key}``: tokens charged as debt (a job that used
  more than it took: paid back before the key admits more);
- ``fairlane_rate_pushbacks_total{key}``: pushbacks (``Throttled`` for the key);
- ``fairlane_rate_wait_seconds_total{key}`` and ``fairlane_rate_woken_total{key}``:
  the time jobs woken by the key waited on it, and how many (their ratio is the mean).

And read at the scrape, for the keys labelled:

- ``fairlane_rate_tokens{key}``: the level now (below zero: a debt); as last stored
  when no job references the key (its rate, and so its refill, is then not known);
- ``fairlane_rate_limit_per_second{key}``, ``fairlane_rate_burst{key}``: its rate in force;
- ``fairlane_rate_paused_seconds{key}``: how long its pause still lasts (0: none);
- ``fairlane_rate_waiters{key}``: jobs waiting for it (summed into ``other`` too);
- ``fairlane_adaptive_limit{key}`` (its value; the limit in force is the floor) and
  ``fairlane_adaptive_limit_max{key}``, for an adaptive concurrency key;
- ``fairlane_rate_keys``: the rate keys the store knows.

**Bounded labels.** Keys can be per end user (``user:acme/42``), so the ``key`` label
is bounded as ``tenant`` is: the ``top_n`` keys by tokens taken get their own label,
and the counters and waiters of every other key read are summed under ``other``;
per-key gauges are exported for the labelled keys only. A key's counters live in its
hash, which expires an hour after its last write: Prometheus reads that as a reset.
A key that moves in or out of the top ``top_n`` moves its counters between its label
and ``other``, as a tenant's do.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fairlane.metrics.tenants import OTHER
from fairlane.store.views.rates import RateKeys, RateKeyView

__all__ = ["DEFAULT_KEY_TOP_N", "labelled_keys", "rate_families"]

#: Rate keys with a ``key`` label of their own, by default.
DEFAULT_KEY_TOP_N = 20


def labelled_keys(views: Sequence[RateKeyView], top_n: int) -> frozenset[str]:
    """The ``top_n`` keys that took the most tokens (ties by name)."""
    top = heapq.nsmallest(top_n, views, key=lambda v: (-v.taken, v.key))
    return frozenset(v.key for v in top)


def _counter(name: str, doc: str) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=["key"])


def _gauge(name: str, doc: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=["key"])


def rate_families(rates: RateKeys, top_n: int = DEFAULT_KEY_TOP_N) -> Iterator[Metric]:
    """The rate keys' families; ``key`` labels bounded to ``top_n`` keys and ``other``."""
    known = GaugeMetricFamily("fairlane_rate_keys", "Rate keys the store knows.")
    known.add_metric([], rates.known)
    yield known
    own = labelled_keys(rates.keys, top_n)
    counters = {
        "taken": _counter(
            "fairlane_rate_tokens_admitted",
            "Tokens a rate key took for the jobs it admitted (jobs, or work units).",
        ),
        "refunded": _counter(
            "fairlane_rate_tokens_refunded",
            "Tokens given back to a rate key (used less than taken, an offer given back).",
        ),
        "debt": _counter(
            "fairlane_rate_tokens_debt",
            "Tokens charged to a rate key as debt (used more than taken).",
        ),
        "pushbacks": _counter(
            "fairlane_rate_pushbacks", "Pushbacks (Throttled) that paused the key."
        ),
        "waited": _counter(
            "fairlane_rate_wait_seconds",
            "Seconds the jobs a rate key woke had waited on it.",
        ),
        "woken": _counter("fairlane_rate_woken", "Jobs a rate key woke from its waiters."),
    }
    waiters = _gauge("fairlane_rate_waiters", "Jobs waiting for a rate key.")
    other = {name: 0.0 for name in (*counters, "waiters")}
    for view in rates.keys:
        values = {
            "taken": view.taken,
            "refunded": view.refunded,
            "debt": view.debt,
            "pushbacks": float(view.pushbacks),
            "waited": view.waited_ms / 1000.0,
            "woken": float(view.woken),
            "waiters": float(view.waiters),
        }
        if view.key in own:
            for name, family in counters.items():
                family.add_metric([view.key], values[name])
            waiters.add_metric([view.key], values["waiters"])
        else:
            for name, n in values.items():
                other[name] += n
    if len(rates.keys) > len(own):
        for name, family in counters.items():
            family.add_metric([OTHER], other[name])
        waiters.add_metric([OTHER], other["waiters"])
    yield from counters.values()
    yield waiters
    yield from _gauges([v for v in rates.keys if v.key in own])


def _gauges(views: Sequence[RateKeyView]) -> Iterator[Metric]:
    tokens = _gauge("fairlane_rate_tokens", "A rate key's tokens now (below zero: a debt).")
    limit = _gauge("fairlane_rate_limit_per_second", "A rate key's sustained rate in force.")
    burst = _gauge("fairlane_rate_burst", "A rate key's burst in force.")
    paused = _gauge(
        "fairlane_rate_paused_seconds", "Seconds a rate key's pause still lasts (0: not paused)."
    )
    adaptive = _gauge(
        "fairlane_adaptive_limit",
        "An adaptive concurrency key's value (its limit in force is the floor).",
    )
    adaptive_max = _gauge("fairlane_adaptive_limit_max", "An adaptive key's largest limit.")
    for view in views:
        if view.tokens is not None:
            tokens.add_metric([view.key], view.tokens)
        if view.rate is not None:
            limit.add_metric([view.key], view.rate.limit / view.rate.per)
            burst.add_metric([view.key], view.rate.capacity)
        left = (view.paused_until_ms or 0) - view.now_ms if view.paused else 0
        paused.add_metric([view.key], left / 1000.0)
        if view.adaptive is not None or view.adaptive_bounds is not None:
            value = view.adaptive if view.adaptive is not None else view.adaptive_limit
            adaptive.add_metric([view.key], float(value or 0))
        if view.adaptive_bounds is not None:
            adaptive_max.add_metric([view.key], view.adaptive_bounds.max)
    yield from (tokens, limit, burst, paused, adaptive, adaptive_max)
