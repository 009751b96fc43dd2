"""The app at a glance: running, dead and live workers, tenants' weights and slots.

Read over every shard: jobs are counted in the shard that holds them and summed, but
workers are not, as every worker heartbeats in every shard (the fleet is the largest
count, and the home shard's ``workers`` set has them all). A tenant's weight is its own
shard's (another shard's is a leftover of a change of the shard count); the running
slots of each tenant come from the records of the jobs holding leases.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from fairlane.policy.shards import shard_of_tenant
from fairlane.store.fields import field_text
from fairlane.store.keys import AppKeys
from fairlane.store.reads import Plan, cmd, server_time
from fairlane.store.records import PLACEMENT, from_values, job_fields

__all__ = ["FleetCounts", "declared_tasks", "fleet_counts", "live_workers", "running_slots"]

#: (lane, class, tenant)
Placement = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class FleetCounts:
    """Jobs running and dead, live workers, and each configured tenant's weight."""

    running: int
    dead: int
    workers: int
    weights: dict[str, float]


def fleet_counts(keys: Sequence[AppKeys]) -> Plan[FleetCounts]:
    reply = yield [
        c
        for k in keys
        for c in (
            cmd("zcard", k.leases),
            cmd("zcard", k.dead),
            cmd("zcard", k.workers),
            cmd("hgetall", k.weights),
        )
    ]
    running = dead = workers = 0
    weights: dict[str, float] = {}
    for shard in range(len(keys)):
        leases, died, beating, raw_weights = reply[4 * shard : 4 * shard + 4]
        running += leases
        dead += died
        workers = max(workers, beating)
        for k, v in raw_weights.items():
            tenant = field_text(k)
            if tenant not in weights or shard_of_tenant(tenant, len(keys)) == shard:
                weights[tenant] = float(field_text(v))
    return FleetCounts(running, dead, workers, weights)


def running_slots(keys: Sequence[AppKeys], limit: int) -> Plan[dict[Placement, int]]:
    """Running slots by (lane, class, tenant), from the records of the jobs holding
    leases (at most ``limit`` per shard)."""
    leases = yield [cmd("zrange", k.leases, 0, limit - 1) for k in keys]
    running = [(shard, field_text(job)) for shard, ids in enumerate(leases) for job in ids]
    fields = job_fields(PLACEMENT)
    reply = yield [cmd("hmget", keys[shard].job(job), fields) for shard, job in running]
    held: dict[Placement, int] = defaultdict(int)
    for (_, job), values in zip(running, reply, strict=True):
        record = from_values(job, PLACEMENT, values)
        if record is not None and record.lane:
            held[(record.lane, record.service_class, record.tenant)] += record.slots or 1
    return dict(held)


def declared_tasks(keys: Sequence[AppKeys]) -> Plan[set[str]]:
    """The tasks the store has recorded (declared by this app's code or another's)."""
    reply = yield [cmd("hkeys", k.tasks) for k in keys]
    return {field_text(task) for batch in reply for task in batch}


def live_workers(keys: AppKeys, max_age: float) -> Plan[list[tuple[str, float]]]:
    """Workers whose heartbeat (in ``keys``' shard) is younger than ``max_age`` s, with
    their age (s), youngest first."""
    (now_ms,) = yield [server_time(keys.workers)]
    (beats,) = yield [
        cmd("zrangebyscore", keys.workers, now_ms - max_age * 1000, "+inf", withscores=True)
    ]
    found = [(field_text(worker), max(0.0, (now_ms - float(ms)) / 1000)) for worker, ms in beats]
    return sorted(found, key=lambda item: item[1])
