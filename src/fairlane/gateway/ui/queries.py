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
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fairlane.app import App
from fairlane.policy.classes import allocate_observed
from fairlane.store.redis import LaneState, StoreUnavailable

__all__ = [
    "LEASE_LIMIT",
    "WAIT_SAMPLE",
    "execute",
    "lanes_of",
    "overview",
    "percentile",
    "server_ms",
    "task_names",
    "text",
]

WAIT_SAMPLE = 200  # completed records per task read for the start-delay percentiles
LEASE_LIMIT = 5000  # running jobs read to attribute running slots to tenants
WAITER_LIMIT = 5000  # throttle waiters read
HEAD = 5  # waiter ids shown per throttle key


def text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def number(value: Any) -> int | None:
    try:
        return int(text(value))
    except ValueError:
        return None


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
    declared = await app.store.client.hkeys(app.store.keys.tasks)
    return sorted({*app.tasks, *(text(t) for t in declared)})


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
    """Running slots by (lane, class, tenant), from the leases of running jobs."""
    store = app.store
    ids = await store.client.zrange(store.keys.leases, 0, LEASE_LIMIT - 1)
    pipe = store.client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(store.keys.job(text(job_id)), "lane", "cls", "tenant", "sl")
    held: dict[tuple[str, str, str], int] = defaultdict(int)
    for lane, cls, tenant, slots in await execute(pipe) if ids else []:
        if lane is not None:
            held[(text(lane), text(cls) or "standard", text(tenant))] += number(slots) or 1
    return held


async def _waits(app: App, tasks: list[str]) -> dict[str, Any]:
    store = app.store
    pipe = store.client.pipeline(transaction=False)
    for task in tasks:
        pipe.zrevrange(store.keys.kept(task, "ok"), 0, WAIT_SAMPLE - 1)
    ids = [text(i) for batch in await execute(pipe) for i in batch]
    pipe = store.client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(store.keys.job(job_id), "lane", "cls", "tenant", "run", "start")
    by_class: dict[tuple[str, str], list[int]] = defaultdict(list)
    by_tenant: dict[str, list[int]] = defaultdict(list)
    for lane, cls, tenant, run, start in await execute(pipe) if ids else []:
        began, due = number(start), number(run)
        if began is None or due is None:
            continue
        delay = max(0, began - due)
        by_class[(text(lane), text(cls) or "standard")].append(delay)
        by_tenant[text(tenant)].append(delay)
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
    store = app.store
    client = store.client
    limits: dict[str, int] = {}
    async for field, value in client.hscan_iter(store.keys.throttles, match="l:*", count=500):
        limits[text(field)[2:]] = number(value) or 0
    waiters: dict[str, list[str]] = defaultdict(list)
    for member in await client.zrange(store.keys.throttle_waiters, 0, WAITER_LIMIT - 1):
        key, _, rest = text(member).partition("\0")
        waiters[key].append(rest.partition("\0")[2])
    names = sorted({*limits, *waiters})
    if not names:
        return []
    pipe = client.pipeline(transaction=False)
    for key in names:
        pipe.hmget(store.keys.throttles, f"u:{key}", f"r:{key}")
    rows = []
    for key, (used, refs) in zip(names, await execute(pipe), strict=True):
        queue = waiters.get(key, [])
        rows.append(
            {
                "key": key,
                "limit": limits.get(key),
                "in_use": number(used) or 0,
                "jobs": number(refs) or 0,
                "waiters": len(queue),
                "head": queue[:HEAD],
            }
        )
    return rows


async def _lane(
    app: App, lane: str, running: dict[tuple[str, str, str], int], weights: dict[str, float]
) -> dict[str, Any]:
    store, keys = app.store, app.store.keys
    classes = list(app.lane_classes(lane).names)
    pipe = store.client.pipeline(transaction=False)
    pipe.zcard(keys.lane(lane).delayed)
    pipe.hgetall(keys.lane_rejections(lane))
    for cls in classes:
        pipe.zrange(keys.class_key(lane, cls, "fair"), 0, -1)
        pipe.zcard(keys.class_key(lane, cls, "deferred"))
    reply = await execute(pipe)
    delayed, rejections = int(reply[0]), {text(k): text(v) for k, v in reply[1].items()}
    state = await store.lane_state(lane)
    alloc = allocate_observed(
        app.lane_classes(lane), state.capacity, state.in_flight, state.waiting
    )
    active = {cls: [text(t) for t in reply[2 + 2 * i]] for i, cls in enumerate(classes)}
    deferred = {cls: int(reply[3 + 2 * i]) for i, cls in enumerate(classes)}
    pipe = store.client.pipeline(transaction=False)
    pairs = [(cls, t) for cls in classes for t in active[cls]]
    for cls, tenant in pairs:
        pipe.zcard(keys.tenant_queue(lane, cls, tenant))
    queued = dict(zip(pairs, await execute(pipe) if pairs else [], strict=True))
    tenants = []
    for cls in classes:
        here = {t for (ln, c, t), n in running.items() if ln == lane and c == cls and n}
        members = sorted(here | set(active[cls]))
        total_run = sum(running.get((lane, cls, t), 0) for t in members) or 0
        total_weight = sum(weights.get(t, 1.0) for t in members) or 1.0
        for tenant in members:
            run = running.get((lane, cls, tenant), 0)
            rejected = rejections.get(tenant, "0|0").partition("|")[0]
            tenants.append(
                {
                    "class": cls,
                    "tenant": tenant,
                    "queued": int(queued.get((cls, tenant), 0)),
                    "running": run,
                    "weight": weights.get(tenant, 1.0),
                    "share": run / total_run if total_run else 0.0,
                    "weight_share": weights.get(tenant, 1.0) / total_weight,
                    "rejected_recent": number(rejected) or 0,
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
    store, keys = app.store, app.store.keys
    pipe = store.client.pipeline(transaction=False)
    pipe.zcard(keys.leases)
    pipe.zcard(keys.dead)
    pipe.zcard(keys.workers)
    pipe.hgetall(keys.weights)
    running_n, dead_n, workers_n, raw_weights = await execute(pipe)
    weights = {text(k): float(text(v)) for k, v in raw_weights.items()}
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
