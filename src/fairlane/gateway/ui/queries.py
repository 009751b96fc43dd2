"""What the dashboard's live view reads: lanes, classes, tenants, throttle keys, waits.

Everything comes from the server's own keys (``fairlane/store/keys.py``) in a few
pipelined round trips, so the view survives restarts of the gateway and of workers:

- a lane's capacity and its classes' in-flight and waiting slots (``lane:<l>:state``),
  judged by the class policy (``fairlane.policy.classes``) for assured, borrowed (held
  above the assured level) and lent slots, as ``fairlane inspect load`` does;
- tenants: the active ones of each class (``fair``) with their queue length, their
  running slots counted from the leases of running jobs, their weight and their recent
  rejections (``adm:rej``);
- throttle keys (``thr``) with their limit, use and waiters (``thr:wait``);
- start delays: the store keeps no histogram, so percentiles are computed from the
  most recent completed records retention keeps (``kept:<task>:ok``, at most
  ``WAIT_SAMPLE`` per task): the time from a job's last attempt becoming eligible to
  its start (``start - run``).

An app split into scheduling shards (``App(shards=n)``) is shown as one: each read above
covers every shard (``app.stores``, which share one client, so still one pipeline per
step). Counts of jobs and slots are summed over the shards and tenants are merged (each
lives in one shard); a lane's capacity is not summed, since every shard counts the whole
fleet's slots; a throttle key's use and waiters are summed over the shards that hold it.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fairlane.app import App
from fairlane.policy.classes import allocate_observed
from fairlane.store.fields import field_int, field_text
from fairlane.store.wire import LaneState, StoreUnavailable

__all__ = [
    "LEASE_LIMIT",
    "WAIT_SAMPLE",
    "execute",
    "lane_state",
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


async def execute(pipe: Any) -> list[Any]:
    """Run a pipeline; an unreachable server is ``StoreUnavailable`` (answered 503)."""
    try:
        reply: list[Any] = await pipe.execute()
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        raise StoreUnavailable(f"the Redis server is unreachable: {exc}") from exc
    return reply


async def server_ms(app: App) -> int:
    return await app.store.server_time_ms()


def lanes_of(app: App) -> list[str]:
    return sorted({*app.lanes, *(t.options.lane for t in app.tasks.values())})


async def task_names(app: App) -> list[str]:
    """Tasks this gateway knows and tasks the store recorded (other apps' code included)."""
    pipe = app.store.client.pipeline(transaction=False)
    for store in app.stores:
        pipe.hkeys(store.keys.tasks)
    declared = [t for batch in await execute(pipe) for t in batch]
    return sorted({*app.tasks, *(field_text(t) for t in declared)})


async def lane_state(app: App, lane: str) -> LaneState:
    """A lane as all shards hold it: slots summed over them, the capacity each counts."""
    states = [await store.lane_state(lane) for store in app.stores]
    if len(states) == 1:
        return states[0]
    in_flight: dict[str, int] = defaultdict(int)
    waiting: dict[str, int] = defaultdict(int)
    for state in states:
        for cls, n in state.in_flight.items():
            in_flight[cls] += n
        for cls, n in state.waiting.items():
            waiting[cls] += n
    # every worker registers its whole size in every shard: C is the fleet's in each,
    # and the largest covers a shard that has not yet heard from a new worker
    capacity = max(state.capacity for state in states)
    return LaneState(capacity, dict(in_flight), dict(waiting))


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


async def _running(app: App) -> dict[tuple[str, str, str], int]:
    """Running slots by (lane, class, tenant), from the leases of running jobs (at most
    ``LEASE_LIMIT`` per shard)."""
    client = app.store.client
    pipe = client.pipeline(transaction=False)
    for store in app.stores:
        pipe.zrange(store.keys.leases, 0, LEASE_LIMIT - 1)
    leases = await execute(pipe)
    pipe = client.pipeline(transaction=False)
    n = 0
    for store, ids in zip(app.stores, leases, strict=True):
        for job_id in ids:
            pipe.hmget(store.keys.job(field_text(job_id)), "lane", "cls", "tenant", "sl")
            n += 1
    held: dict[tuple[str, str, str], int] = defaultdict(int)
    for lane, cls, tenant, slots in await execute(pipe) if n else []:
        if lane is not None:
            held[(field_text(lane), field_text(cls) or "standard", field_text(tenant))] += (
                field_int(slots) or 1
            )
    return held


async def _recent_completed(app: App, tasks: list[str]) -> list[tuple[int, str]]:
    """(shard, job id) of the ``WAIT_SAMPLE`` most recently completed jobs of each task,
    over all shards (each shard's newest, merged by finish time)."""
    pipe = app.store.client.pipeline(transaction=False)
    for task in tasks:
        for store in app.stores:
            pipe.zrevrange(store.keys.kept(task, "ok"), 0, WAIT_SAMPLE - 1, withscores=True)
    reply = await execute(pipe)
    shards = len(app.stores)
    picked: list[tuple[int, str]] = []
    for i in range(len(tasks)):
        batches = reply[i * shards : (i + 1) * shards]
        newest = heapq.nlargest(
            WAIT_SAMPLE,
            (
                (score, shard, field_text(job))
                for shard, got in enumerate(batches)
                for job, score in got
            ),
        )
        picked.extend((shard, job) for _, shard, job in newest)
    return picked


async def _waits(app: App, tasks: list[str]) -> dict[str, Any]:
    picked = await _recent_completed(app, tasks)
    pipe = app.store.client.pipeline(transaction=False)
    for shard, job_id in picked:
        pipe.hmget(app.stores[shard].keys.job(job_id), "lane", "cls", "tenant", "run", "start")
    by_class: dict[tuple[str, str], list[int]] = defaultdict(list)
    by_tenant: dict[str, list[int]] = defaultdict(list)
    for lane, cls, tenant, run, start in await execute(pipe) if picked else []:
        began, due = field_int(start), field_int(run)
        if began is None or due is None:
            continue
        delay = max(0, began - due)
        by_class[(field_text(lane), field_text(cls) or "standard")].append(delay)
        by_tenant[field_text(tenant)].append(delay)
    return {
        "note": (
            f"start delay (eligible to started, last attempt) of the {WAIT_SAMPLE} most "
            "recent completed jobs per task that retention keeps; the store keeps no "
            "histogram"
        ),
        "by_class": [
            {"lane": lane, "class": cls, **_dist(v)} for (lane, cls), v in sorted(by_class.items())
        ],
        "by_tenant": [{"tenant": t, **_dist(v)} for t, v in sorted(by_tenant.items())],
    }


async def _throttles(app: App) -> list[dict[str, Any]]:
    """Throttle keys merged over the shards: a key's use, jobs and waiters summed over
    those that hold it, its limit as any of them recorded it (the task declares it)."""
    client = app.store.client
    limits: dict[str, int] = {}
    waiters: dict[str, list[str]] = defaultdict(list)
    held: list[tuple[int, str]] = []  # (shard, key) of every key a shard knows
    for shard, store in enumerate(app.stores):
        known: set[str] = set()
        async for field, value in client.hscan_iter(store.keys.throttles, match="l:*", count=500):
            key = field_text(field)[2:]
            limits[key] = max(limits.get(key, 0), field_int(value) or 0)
            known.add(key)
        for member in await client.zrange(store.keys.throttle_waiters, 0, WAITER_LIMIT - 1):
            key, _, rest = field_text(member).partition("\0")
            waiters[key].append(rest.partition("\0")[2])
            known.add(key)
        held.extend((shard, key) for key in sorted(known))
    if not held:
        return []
    pipe = client.pipeline(transaction=False)
    for shard, key in held:
        pipe.hmget(app.stores[shard].keys.throttles, f"u:{key}", f"r:{key}")
    in_use: dict[str, int] = defaultdict(int)
    jobs: dict[str, int] = defaultdict(int)
    for (_, key), (used, refs) in zip(held, await execute(pipe), strict=True):
        in_use[key] += field_int(used) or 0
        jobs[key] += field_int(refs) or 0
    rows = []
    for key in sorted({key for _, key in held}):
        queue = waiters.get(key, [])
        rows.append(
            {
                "key": key,
                "limit": limits.get(key),
                "in_use": in_use[key],
                "jobs": jobs[key],
                "waiters": len(queue),
                "head": queue[:HEAD],
            }
        )
    return rows


async def _lane(
    app: App, lane: str, running: dict[tuple[str, str, str], int], weights: dict[str, float]
) -> dict[str, Any]:
    stores = app.stores
    classes = list(app.lane_classes(lane).names)
    pipe = app.store.client.pipeline(transaction=False)
    for store in stores:
        keys = store.keys
        pipe.zcard(keys.lane(lane).delayed)
        pipe.hgetall(keys.lane_rejections(lane))
        for cls in classes:
            pipe.zrange(keys.class_key(lane, cls, "fair"), 0, -1)
            pipe.zcard(keys.class_key(lane, cls, "deferred"))
    reply = await execute(pipe)
    width = 2 + 2 * len(classes)  # replies per shard
    delayed = 0
    rejections: dict[str, str] = {}
    # (class, tenant) -> the shards where the tenant is active in the class: its own, but
    # a count of shards changed under live queues leaves some in another
    active: dict[tuple[str, str], list[int]] = defaultdict(list)
    deferred: dict[str, int] = defaultdict(int)
    for shard in range(len(stores)):
        part = reply[shard * width : (shard + 1) * width]
        delayed += int(part[0])
        rejections.update({field_text(k): field_text(v) for k, v in part[1].items()})
        for i, cls in enumerate(classes):
            for tenant in part[2 + 2 * i]:
                active[(cls, field_text(tenant))].append(shard)
            deferred[cls] += int(part[3 + 2 * i])
    state = await lane_state(app, lane)
    alloc = allocate_observed(
        app.lane_classes(lane), state.capacity, state.in_flight, state.waiting
    )
    pipe = app.store.client.pipeline(transaction=False)
    where = [(pair, shard) for pair, shards in active.items() for shard in shards]
    for (cls, tenant), shard in where:
        pipe.zcard(stores[shard].keys.tenant_queue(lane, cls, tenant))
    queued: dict[tuple[str, str], int] = defaultdict(int)
    for (pair, _), n in zip(where, await execute(pipe) if where else [], strict=True):
        queued[pair] += int(n)
    tenants = []
    for cls in classes:
        here = {t for (ln, c, t), n in running.items() if ln == lane and c == cls and n}
        members = sorted(here | {t for c, t in active if c == cls})
        total_run = sum(running.get((lane, cls, t), 0) for t in members) or 0
        total_weight = sum(weights.get(t, 1.0) for t in members) or 1.0
        for tenant in members:
            run = running.get((lane, cls, tenant), 0)
            rejected = rejections.get(tenant, "0|0").partition("|")[0]
            tenants.append(
                {
                    "class": cls,
                    "tenant": tenant,
                    "queued": queued.get((cls, tenant), 0),
                    "running": run,
                    "weight": weights.get(tenant, 1.0),
                    "share": run / total_run if total_run else 0.0,
                    "weight_share": weights.get(tenant, 1.0) / total_weight,
                    "rejected_recent": field_int(rejected) or 0,
                }
            )
    return {
        "name": lane,
        "capacity": alloc.capacity,
        "free": alloc.free,
        "pressure": alloc.pressure,
        "delayed": delayed,
        "classes": [_class_row(app, lane, view, state, deferred) for view in alloc.classes],
        "tenants": tenants,
    }


def _class_row(
    app: App, lane: str, view: Any, state: LaneState, deferred: dict[str, int]
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
    """The live view: counters, lanes with classes and tenants, throttles, waits."""
    pipe = app.store.client.pipeline(transaction=False)
    for store in app.stores:
        pipe.zcard(store.keys.leases)
        pipe.zcard(store.keys.dead)
        pipe.zcard(store.keys.workers)
        pipe.hgetall(store.keys.weights)
    reply = await execute(pipe)
    running_n = dead_n = workers_n = 0
    weights: dict[str, float] = {}
    for shard in range(len(app.stores)):
        leases, dead, workers, raw_weights = reply[4 * shard : 4 * shard + 4]
        running_n += leases
        dead_n += dead
        # every worker heartbeats in every shard: the fleet is counted once, not per shard
        workers_n = max(workers_n, workers)
        for k, v in raw_weights.items():
            tenant = field_text(k)
            # the tenant's own shard has the say; another's is a leftover of a reshard
            if tenant not in weights or app.shard_of(tenant) == shard:
                weights[tenant] = float(field_text(v))
    running = await _running(app)
    # admission decisions per lane, class and reason are the metrics' business, not a card's
    stats = {k: v for k, v in (await app.stats()).items() if k != "seq" and ":" not in k}
    return {
        "app": app.name,
        "now_ms": await server_ms(app),
        "counts": {"running": running_n, "dead": dead_n, "workers": workers_n},
        "stats": dict(sorted(stats.items())),
        "lanes": [await _lane(app, lane, running, weights) for lane in lanes_of(app)],
        "throttles": await _throttles(app),
        "waits": await _waits(app, await task_names(app)),
    }
