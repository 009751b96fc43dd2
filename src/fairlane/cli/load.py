"""``fairlane inspect load``: each lane's live capacity and what its classes hold.

It reads the lane's cached capacity and its classes' in-flight and waiting slots from
the server, then asks the class policy (``fairlane.policy.classes.allocate``) what it
would decide for that state: each class's assured slots, ceiling, claim, what it
borrowed or lent, and why its head job may or may not start now. Below it, the
tenants whose queues hold jobs with fairness keys: how many keys share each one's part,
and the keys furthest ahead of its queue's head (``fairlane.store.views.fairkeys``).

In an app split into scheduling shards the lane is shown as the shards hold it
together: in-flight and waiting slots summed over them, the capacity not (each shard
counts every worker's slots, so it is the same in all).
"""

from __future__ import annotations

from rich.table import Table

from fairlane.app import App
from fairlane.cli._common import AppSpec, RedisUrl, console, load_app, run
from fairlane.policy.classes import Allocation, allocate_observed
from fairlane.store.views.fairkeys import TenantKeys, fairness_keys
from fairlane.store.views.lanes import LaneState, lane_states

__all__ = ["inspect_load"]


async def _lane_states(
    app: App, lanes: list[str]
) -> tuple[dict[str, LaneState], dict[str, list[TenantKeys]]]:
    async with app:
        states = await app.store.view(lane_states, lanes)
        keyed = {
            lane: await app.store.view(fairness_keys, lane, app.lane_classes(lane).names)
            for lane in lanes
        }
        return states, keyed


def _keys_table(lane: str, keyed: list[TenantKeys]) -> Table:
    table = Table(title=f"lane {lane!r}: fairness keys", title_justify="left")
    for column in ("class", "tenant", "keys", "furthest ahead (FIFO steps above the head)"):
        table.add_column(column)
    for view in keyed:
        ahead = ", ".join(f"{key} +{steps:g}" for key, steps in view.ahead)
        table.add_row(view.service_class, view.tenant, str(view.keys), ahead)
    return table


def _allocation(app: App, lane: str, state: LaneState) -> Allocation:
    return allocate_observed(app.lane_classes(lane), state.capacity, state.in_flight, state.waiting)


def inspect_load(app_spec: AppSpec, redis_url: RedisUrl = None) -> None:
    """Each lane's live capacity (its workers' slots) and its classes' share of it."""
    app = load_app(app_spec, redis_url)
    lanes = sorted({*app.lanes, *(t.options.lane for t in app.tasks.values())})
    states, keyed = run(_lane_states(app, lanes))
    out = console()
    for lane in lanes:
        state = states[lane]
        alloc = _allocation(app, lane, state)
        table = Table(
            title=f"lane {lane!r}: capacity {alloc.capacity} slots, {alloc.free} free, "
            f"{alloc.pressure} waiting (non-batch)",
            title_justify="left",
        )
        columns = ("class", "in flight", "waiting", "assured", "ceiling", "claim", "borrowed")
        for column in (*columns, "lent", "next head"):
            table.add_column(column)
        for view in alloc.classes:
            table.add_row(
                view.name,
                str(view.in_flight),
                str(state.waiting.get(view.name, 0)),
                str(view.assured),
                str(view.ceiling),
                str(view.claim),
                str(view.borrowed),
                str(view.lent),
                view.reason,
            )
        out.print(table)
        if keyed[lane]:
            out.print(_keys_table(lane, keyed[lane]))
    if not lanes:
        out.print(f"app {app.name!r} declares no lanes and has no tasks")
