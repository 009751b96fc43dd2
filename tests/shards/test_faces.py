"""The read and operate faces of an app split into scheduling shards: the metrics
reader, the dashboard's JSON API, the CLI and the demo's tracker each show the app as
one, against a real server and a real worker.

The app has three shards and one tenant in each. Jobs on the ``parked`` lane, which no
worker serves, stay queued (a different number in each shard, so a sum is told apart
from any one shard's count); jobs of ``hold`` run until the test lets them finish, so
slots are in flight in two shards at once.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import anyio
import httpx
import pytest
from typer.testing import CliRunner, Result

from fairlane import App, Job, TaskFailed
from fairlane.cli import cli
from fairlane.config.pools import parse_config
from fairlane.demo.stats import RowKey, Tracker
from fairlane.demo.workload import Arrival
from fairlane.gateway import create_app
from fairlane.metrics import StoreReader
from tests.e2e.helpers import WAIT, eventually, fast_settings, running_worker
from tests.metrics.helpers import scrape_store, series, value
from tests.ui.helpers import ADMIN, ADMIN_KEY

pytestmark = pytest.mark.anyio

SHARDS = 3
SLOTS = 4  # the worker's concurrency
PARKED = "parked"
# the parked lane admits two queued jobs per tenant and refuses the next
CONFIG: dict[str, Any] = {
    "pools": {
        PARKED: {
            "capacity_units": 1000,
            "classes": {
                "standard": {
                    "nominal_share": 1.0,
                    "max_queue": 1000,
                    "tenant_max_queue": 2,
                    "response_when_full": "reject",
                }
            },
        }
    },
    "estimation": {"safety_multiplier": 1.0},
}


def faces_app(namespace: str, redis_url: str, release: asyncio.Event | None = None) -> App:
    app = App(
        namespace,
        redis_url=redis_url,
        settings=fast_settings(),
        config=parse_config(CONFIG),
        shards=SHARDS,
    )

    @app.task(gateway=True, name="later", lane=PARKED, attempts=1)
    async def later(n: int) -> int:
        return n

    @app.task(gateway=True, name="hold", attempts=1)
    async def hold() -> None:
        if release is not None:
            await release.wait()

    @app.task(gateway=True, name="boom", attempts=1)
    async def boom(message: str) -> None:
        raise LookupError(message)

    return app


def one_tenant_per_shard(app: App) -> list[str]:
    """A tenant name for each shard, in shard order."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < app.shards:
        found.setdefault(app.shard_of(f"tenant-{i}"), f"tenant-{i}")
        i += 1
    return [found[shard] for shard in range(app.shards)]


@dataclass
class Workload:
    tenants: list[str]
    parked: list[Job[Any]]  # queued: shard i's tenant has min(i + 1, 2) of them
    rejected: int
    held: list[Job[Any]]  # running: one in shard 0, two in shard 2
    dead: list[Job[Any]]  # one per shard


@asynccontextmanager
async def workload(app: App, release: asyncio.Event) -> AsyncIterator[Workload]:
    """The jobs above, with the worker running and the held jobs in flight until the
    end (``release`` lets them finish)."""
    tenants = one_tenant_per_shard(app)
    assert [app.shard_of(t) for t in tenants] == list(range(SHARDS))
    later, hold, boom = app.get_task("later"), app.get_task("hold"), app.get_task("boom")
    parked: list[Job[Any]] = []
    rejected = 0
    for shard, tenant in enumerate(tenants):
        for n in range(shard + 1):
            answer = await later.submit(n, tenant=tenant)
            if answer.job is None:
                rejected += 1
            else:
                parked.append(answer.job)
    dead = [await boom.enqueue(f"no {t}", tenant=t) for t in tenants]
    async with running_worker(app, concurrency=SLOTS):
        try:
            for job in dead:
                with pytest.raises(TaskFailed):
                    await job.result(timeout=WAIT)
            held = [await hold.enqueue(tenant=t) for t in (tenants[0], tenants[2], tenants[2])]

            async def all_running() -> bool:
                return [await job.status() for job in held] == ["running"] * 3

            await eventually(all_running)
            yield Workload(tenants, parked, rejected, held, dead)
        finally:
            release.set()


async def summed_lane(app: App, lane: str) -> tuple[set[int], dict[str, int], dict[str, int]]:
    """Each shard's capacity of ``lane``, and its in-flight and waiting slots summed."""
    capacities: set[int] = set()
    in_flight: dict[str, int] = {}
    waiting: dict[str, int] = {}
    for store in app.stores:
        state = await store.lane_state(lane)
        capacities.add(state.capacity)
        for cls, n in state.in_flight.items():
            in_flight[cls] = in_flight.get(cls, 0) + n
        for cls, n in state.waiting.items():
            waiting[cls] = waiting.get(cls, 0) + n
    return capacities, in_flight, waiting


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args, env={"COLUMNS": "250"})


def row_of(output: str, needle: str) -> str:
    return next(line for line in output.splitlines() if needle in line)


async def test_metrics_reader_sums_the_shards(redis_url: str, namespace: str) -> None:
    release = asyncio.Event()
    app = faces_app(namespace, redis_url, release)
    async with app, workload(app, release) as work:
        reader = StoreReader(
            redis_url,
            app.name,
            [app.settings.default_lane, PARKED],
            max_age=0.0,
            shards=app.shards,
        )
        try:
            samples = await scrape_store(reader)
        finally:
            reader.close()
        capacities, in_flight, _ = await summed_lane(app, "default")
        assert capacities == {SLOTS}  # every shard counts the one worker's slots
        assert value(samples, "fairlane_lane_capacity_slots", lane="default") == SLOTS
        assert in_flight == {"standard": 3}
        assert value(samples, "fairlane_lane_in_flight_slots", lane="default") == 3
        _, _, waiting = await summed_lane(app, PARKED)
        assert waiting == {"standard": len(work.parked)} and len(work.parked) == 5
        assert value(samples, "fairlane_lane_waiting_slots", lane=PARKED) == 5
        decisions = series(samples, "fairlane_admission_decisions_total")
        by_outcome = {dict(k)["outcome"]: v for k, v in decisions.items()}
        assert by_outcome == {"accepted": 5, "rejected": work.rejected} and work.rejected == 1
        shard_stats = [await store.stats() for store in app.stores]
        accepted = "adm:accepted:none:parked:standard"
        assert [s.get(accepted, 0) for s in shard_stats] == [1, 2, 2]
        events = {
            dict(k)["event"]: v for k, v in series(samples, "fairlane_store_events_total").items()
        }
        summed = await app.stats()
        assert events == {k: v for k, v in summed.items() if k != "fifo" and ":" not in k}
        assert len([s for s in shard_stats if s.get("failed")]) == SHARDS  # one dead each
        assert value(samples, "fairlane_queue_oldest_age_seconds", lane=PARKED) > 0


async def test_cli_sees_every_shard(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = asyncio.Event()
    app = faces_app(namespace, redis_url, release)
    # the CLI loads an app of its own, as it would from the user's module
    module = ModuleType(f"faces_{namespace}")
    module.app = faces_app(namespace, redis_url)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)

    async def cli_run(group: str, command: str, *args: str) -> Result:
        argv = [group, command, f"{module.__name__}:app", *args, "--redis-url", redis_url]
        result = await anyio.to_thread.run_sync(lambda: invoke(argv))
        assert result.exit_code == 0, result.output
        return result

    async with app, workload(app, release) as work:
        load = await cli_run("inspect", "load")
        assert f"lane 'default': capacity {SLOTS} slots, 1 free" in load.output
        parked = load.output.split(f"lane '{PARKED}'")[1]
        cells = [cell.strip() for cell in row_of(parked, "standard").strip("│ ").split("│")]
        assert cells[:3] == ["standard", "0", "5"]

        dead = await cli_run("dead", "list")
        for job, tenant in zip(work.dead, work.tenants, strict=True):
            assert tenant in row_of(dead.output, job.id)
            assert f"LookupError: no {tenant}" in row_of(dead.output, job.id)

        far = work.parked[-1]
        assert far.id.startswith("s2.")
        status = await cli_run("job", "status", far.id)
        assert work.tenants[2] in row_of(status.output, "tenant")
        assert "queued" in row_of(status.output, "status")
        cancel = await cli_run("job", "cancel", far.id)
        assert f"job {far.id} cancelled" in cancel.output
        assert await far.status() == "cancelled"


async def test_dashboard_sees_every_shard(redis_url: str, namespace: str) -> None:
    release = asyncio.Event()
    app = faces_app(namespace, redis_url, release)
    async with app, workload(app, release) as work:
        api = create_app(app, admin_key=ADMIN_KEY)
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:

            async def get(path: str) -> Any:
                r = await http.get(path, headers=ADMIN)
                assert r.status_code == 200, r.text
                return r.json()

            async def post(path: str) -> Any:
                r = await http.post(path, headers=ADMIN)
                assert r.status_code == 200, r.text
                return r.json()

            overview = await get("/ui/api/overview")
            assert overview["counts"] == {"running": 3, "dead": 3, "workers": 1}
            lanes = {lane["name"]: lane for lane in overview["lanes"]}
            parked = {t["tenant"]: t["queued"] for t in lanes[PARKED]["tenants"]}
            assert parked == dict(zip(work.tenants, [1, 2, 2], strict=True))
            default = lanes["default"]
            assert default["capacity"] == SLOTS and default["free"] == SLOTS - 3
            running = {t["tenant"]: t["running"] for t in default["tenants"]}
            assert running == {work.tenants[0]: 1, work.tenants[2]: 2}
            in_flight = {c["name"]: c["in_flight"] for c in default["classes"]}
            assert in_flight["standard"] == 3 and sum(in_flight.values()) == 3

            async def ids(query: str) -> set[str]:
                return {j["id"] for j in (await get(f"/ui/api/jobs?{query}"))["jobs"]}

            assert await ids("state=queued") == {j.id for j in work.parked}
            assert await ids("state=running") == {j.id for j in work.held}
            assert await ids("state=dead") == {j.id for j in work.dead}
            assert await ids(f"tenant={work.tenants[1]}&state=dead,queued") == {
                work.dead[1].id,
                *(j.id for j in work.parked if j.id.startswith("s1.")),
            }

            far = work.parked[-1]
            detail = await get(f"/ui/api/jobs/{far.id}")
            assert (detail["tenant"], detail["state"]) == (work.tenants[2], "queued")
            assert detail["explanation"]["summary"]
            assert (await post(f"/ui/api/jobs/{far.id}/cancel"))["result"] == "cancelled"
            again = await post(f"/ui/api/jobs/{far.id}/retry")
            assert again["result"] == "accepted" and again["new_id"].startswith("s2.")
            gone = work.dead[2]
            assert (await post(f"/ui/api/jobs/{gone.id}/redrive"))["result"] == "redriven"
            events = [e["kind"] for e in (await get(f"/ui/api/jobs/{gone.id}"))["events"]]
            assert "redriven" in events


async def test_demo_tracker_reads_every_shard(redis_url: str, namespace: str) -> None:
    app = faces_app(namespace, redis_url)
    tenants = one_tenant_per_shard(app)
    rows = [RowKey(t, PARKED, "standard") for t in tenants]
    tracker = Tracker(
        mode="fair", app=app.name, seconds=1, window=1, lanes={PARKED: 1}, rows=rows, weights=None
    )
    async with app:
        later = app.get_task("later")
        for row in rows:
            arrival = Arrival(0.0, row.tenant, "chat", PARKED, "standard", (), False, 0, 0)
            tracker.answered(tracker.track(arrival), await later.submit(1, tenant=row.tenant))
        await tracker.poll(app.store)  # one store of a sharded app: the rest found from it
        assert [t.status for t in tracker.jobs] == ["queued"] * SHARDS
        assert all(t.enq_ms for t in tracker.jobs)
        assert tracker.lane_states[PARKED].waiting == {"standard": SHARDS}
        await tracker.poll(app.stores)
        assert tracker.snapshot().lanes[0].waiting == {"standard": SHARDS}
