"""What the dashboard's live view shows: lanes, classes, tenants, throttle and rate keys,
waits.

Everything is read from the server's own keys through the store's read models
(``fairlane.store.views``) in a few pipelined round trips, so the view survives
restarts of the gateway and of workers:

- a lane's capacity and its classes' in-flight and waiting slots, judged by the class
  policy (``fairlane.policy.classes``) for assured, borrowed (held above the assured
  level) and lent slots, as ``fairlane inspect load`` does;
- tenants: the active ones of each class with their queue length, their running slots
  counted from the records of running jobs, their weight and their recent rejections;
- throttle keys with their limit, use and waiters (an adaptive key's limit in force
  and its bounds beside);
- rate keys beside them: each key's rate in force, its tokens now, a pause and its
  cause, when its waiters are due, its counters (tokens taken, refunded, charged as
  debt; pushbacks; jobs woken and the mean time they waited) and its first waiters,
  the ``RATE_LIMIT`` keys written most recently (``fairlane.store.views.rates``);
- start delays: percentiles of the time from a job's last attempt becoming eligible to
  its start, over the ``WAIT_SAMPLE`` most recent completed jobs per task that
  retention keeps (the store keeps no histogram);
- global keys, for an app of many shards: each key its shards share, its limit, and
  each shard's part of it, the slots it holds and uses, and the jobs and tenants'
  weight waiting on it there (``fairlane.store.views.globalkeys``), at most
  ``GLOBAL_KEY_LIMIT`` keys per shard.

An app split into scheduling shards (``App(shards=n)``) is shown as one: every read
covers every shard (the read models merge them: counts of jobs and slots summed,
tenants merged, a lane's capacity as each shard counts the whole fleet's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fairlane.app import App
from fairlane.insight.globalkeys import global_key_row
from fairlane.policy.classes import ClassView, allocate_observed
from fairlane.store.views.fleet import declared_tasks, fleet_counts, running_slots
from fairlane.store.views.globalkeys import global_keys
from fairlane.store.views.lanes import LaneState
from fairlane.store.views.rates import UNLIMITED, RateKeys, RateKeyView, rate_keys
from fairlane.store.views.tenants import lane_tenants
from fairlane.store.views.throttles import throttles
from fairlane.store.views.totals import split_stats
from fairlane.store.views.waits import start_delays

__all__ = [
    "LEASE_LIMIT",
    "WAIT_SAMPLE",
    "lanes_of",
    "overview",
    "percentile",
    "server_ms",
    "task_names",
]

WAIT_SAMPLE = 200  # completed records per task read for the start-delay percentiles
LEASE_LIMIT = 5000  # running jobs read to attribute running slots to tenants
WAITER_LIMIT = 5000  # throttle waiters read
HEAD = 5  # waiter ids shown per throttle key
RATE_LIMIT = 500  # rate keys read (the most recently written)
GLOBAL_KEY_LIMIT = 500  # global keys read per shard

#: running slots by (lane, class, tenant)
Running = dict[tuple[str, str, str], int]


async def server_ms(app: App) -> int:
    return await app.store.server_time_ms()


def lanes_of(app: App) -> list[str]:
    return sorted({*app.lanes, *(t.options.lane for t in app.tasks.values())})


async def task_names(app: App) -> list[str]:
    """Tasks this gateway knows and tasks the store recorded (other apps' code included)."""
    return sorted({*app.tasks, *await app.store.view(declared_tasks)})


def percentile(values: Sequence[int], q: float) -> int | None:
    """Nearest-rank percentile of ``values`` (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _dist(values: list[int]) -> dict[str, int | None]:
    return {
        "n": len(values),
        "p50": percentile(values, 0.5),
        "p95": percentile(values, 0.95),
        "p99": percentile(values, 0.99),
        "max": max(values) if values else None,
    }


async def _waits(app: App, tasks: list[str]) -> dict[str, Any]:
    delays = await app.store.view(start_delays, tasks, WAIT_SAMPLE)
    return {
        "note": (
            f"start delay (eligible to started, last attempt) of the {WAIT_SAMPLE} most "
            "recent completed jobs per task that retention keeps; the store keeps no "
            "histogram"
        ),
        "by_class": [
            {"lane": lane, "class": cls, **_dist(v)}
            for (lane, cls), v in sorted(delays.by_class.items())
        ],
        "by_tenant": [{"tenant": t, **_dist(v)} for t, v in sorted(delays.by_tenant.items())],
    }


def _adaptive(view: RateKeyView | None) -> dict[str, Any] | None:
    if view is None or (view.adaptive is None and view.adaptive_bounds is None):
        return None
    bounds = view.adaptive_bounds
    return {
        "value": view.adaptive,
        "limit": view.adaptive_limit,
        "max": bounds.max if bounds else None,
        "min": bounds.min if bounds else None,
    }


async def _throttles(app: App, rates: RateKeys) -> list[dict[str, Any]]:
    return [
        {
            "key": view.key,
            # a key named only as a rate key has no concurrency limit: its row is here
            # for its use, its tokens are in the rate keys' table
            "limit": None if view.limit == UNLIMITED else view.limit,
            "rate_key": rates.get(view.key) is not None,
            "in_use": view.in_use,
            "offers": view.offers,
            "jobs": view.jobs,
            "waiters": len(view.waiters),
            "head": view.waiters[:HEAD],
            "adaptive": _adaptive(rates.get(view.key)),
        }
        for view in await app.store.view(throttles, WAITER_LIMIT)
    ]


def _rate_row(view: RateKeyView) -> dict[str, Any]:
    rate = view.rate
    return {
        "key": view.key,
        "rate": None
        if rate is None
        else {"limit": rate.limit, "per": rate.per, "burst": rate.capacity, "cost": rate.cost},
        "tokens": view.tokens,
        "paused_until_ms": view.paused_until_ms,
        "pause_cause": view.pause_cause,
        "due_ms": view.due_ms,
        "next_tokens_ms": view.next_tokens_ms(),
        "adaptive": _adaptive(view),
        "taken": view.taken,
        "refunded": view.refunded,
        "debt": view.debt,
        "pushbacks": view.pushbacks,
        "woken": view.woken,
        "mean_wait_ms": view.waited_ms / view.woken if view.woken else None,
        "waiters": view.waiters,
        "head": list(view.head),
    }


async def _global_keys(app: App) -> dict[str, Any]:
    if app.shards < 2:
        return {"known": 0, "keys": []}
    shared = await app.store.view(global_keys, GLOBAL_KEY_LIMIT)
    return {"known": shared.known, "keys": [global_key_row(v) for v in shared.keys]}


def _rates(rates: RateKeys) -> dict[str, Any]:
    return {"known": rates.known, "keys": [_rate_row(v) for v in rates.keys]}


async def _lane(app: App, lane: str, running: Running, weights: dict[str, float]) -> dict[str, Any]:
    classes = list(app.lane_classes(lane).names)
    detail = await app.store.view(lane_tenants, lane, classes)
    state = detail.state
    alloc = allocate_observed(
        app.lane_classes(lane), state.capacity, state.in_flight, state.waiting
    )
    tenants = []
    for cls in classes:
        here = {t for (ln, c, t), n in running.items() if ln == lane and c == cls and n}
        members = sorted(here | {t for c, t in detail.queued if c == cls})
        total_run = sum(running.get((lane, cls, t), 0) for t in members) or 0
        total_weight = sum(weights.get(t, 1.0) for t in members) or 1.0
        for tenant in members:
            run = running.get((lane, cls, tenant), 0)
            tenants.append(
                {
                    "class": cls,
                    "tenant": tenant,
                    "queued": detail.queued.get((cls, tenant), 0),
                    "running": run,
                    "weight": weights.get(tenant, 1.0),
                    "share": run / total_run if total_run else 0.0,
                    "weight_share": weights.get(tenant, 1.0) / total_weight,
                    "rejected_recent": detail.rejected.get(tenant, 0),
                }
            )
    return {
        "name": lane,
        "capacity": alloc.capacity,
        "free": alloc.free,
        "pressure": alloc.pressure,
        "delayed": state.delayed,
        "classes": [_class_row(app, lane, view, state, detail.deferred) for view in alloc.classes],
        "tenants": tenants,
    }


def _class_row(
    app: App, lane: str, view: ClassView, state: LaneState, deferred: dict[str, int]
) -> dict[str, Any]:
    spec = app.lane_classes(lane)[view.name]
    return {
        "name": view.name,
        "nominal_share": spec.nominal_share,
        "batch": spec.batch,
        "assured": view.assured,
        "ceiling": view.ceiling,
        "in_flight": view.in_flight,
        "waiting": max(0, state.waiting.get(view.name, 0)),
        "deferred": deferred.get(view.name, 0),
        "borrowed": view.borrowed,
        "lent": view.lent,
        "reason": str(view.reason),
    }


async def overview(app: App) -> dict[str, Any]:
    """The live view: counters, lanes with classes and tenants, throttle and rate keys,
    global keys, waits."""
    counts = await app.store.view(fleet_counts)
    running = await app.store.view(running_slots, LEASE_LIMIT)
    # admission decisions per lane, class and reason are the metrics' business, not a card's
    stats, _ = split_stats(await app.stats())
    rates = await app.store.view(rate_keys, RATE_LIMIT, HEAD, in_force=True)
    return {
        "app": app.name,
        "now_ms": await server_ms(app),
        "counts": {"running": counts.running, "dead": counts.dead, "workers": counts.workers},
        "stats": dict(sorted(stats.items())),
        "lanes": [await _lane(app, lane, running, counts.weights) for lane in lanes_of(app)],
        "throttles": await _throttles(app, rates),
        "rates": _rates(rates),
        "global_keys": await _global_keys(app),
        "waits": await _waits(app, await task_names(app)),
    }
