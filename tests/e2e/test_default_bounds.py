"""Every queue bounded by default, end to end with real app calls on a real server.

A lane without an admission pool (the default lane here) refuses a job past
``queues.tenant_max_queued`` (ready jobs in the tenant's class queue) or
``queues.lane_max_queued`` (the lane's ready slots; ready plus scheduled for a
scheduled job) with ``Rejected(reason, retry_after)``, the Retry-After growing with the
tenant's recent refusals; the gateway answers 429 with the reason and a Retry-After
header; jobs leaving the lane (run by a worker) make room again; ``None`` lifts a
bound; a lane with a pool keeps its pool's bounds. A pool that names no lane the app
uses stops the app at connect with the pools and the lanes named, and ``fairlane
doctor`` reports it; ``inspect lanes`` shows each lane's bounds.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

from fairlane import App, Rejected
from fairlane.cli import cli
from fairlane.config.pools import parse_config
from fairlane.config.settings import ConfigError
from tests.e2e.helpers import fast_settings
from tests.gateway.helpers import gateway, pool

pytestmark = pytest.mark.anyio

WIDE = {"COLUMNS": "250"}


def bounded_app(namespace: str, redis_url: str, **queues: int | None) -> App:
    app = App(namespace, redis_url=redis_url, settings=fast_settings(queues=queues))

    @app.task(name="echo", attempts=1)
    async def echo(text: str = "") -> str:
        return text

    return app


async def test_a_tenant_past_its_bound_is_refused_with_a_reason_and_a_growing_retry_after(
    redis_url: str, namespace: str
) -> None:
    app = bounded_app(namespace, redis_url, tenant_max_queued=3, lane_max_queued=100)
    echo = app.get_task("echo")
    async with app:
        for n in range(3):
            await echo.enqueue(str(n), tenant="acme")
        with pytest.raises(Rejected) as first:
            await echo.enqueue("x", tenant="acme")
        assert first.value.reason == "tenant_queue_full"
        answer = await echo.submit("x", tenant="acme")
        assert (answer.status, answer.reason, answer.job) == ("rejected", "tenant_queue_full", None)
        # admission's Retry-After: 2 s doubling per refusal in the last minute, +-30 %
        assert 1.4 <= first.value.retry_after <= 2.6
        assert answer.retry_after is not None and 2.8 <= answer.retry_after <= 5.2
        # another tenant still has room; nothing of the refused calls was stored
        await echo.enqueue("y", tenant="other")
        assert (await app.stats()).get("rejected") == 2
        # jobs that leave the lane make room again
        await app.run_worker(concurrency=4, burst=True)
        await echo.enqueue("again", tenant="acme")


async def test_a_full_lane_is_refused_for_every_tenant_until_jobs_leave(
    redis_url: str, namespace: str
) -> None:
    app = bounded_app(namespace, redis_url, tenant_max_queued=100, lane_max_queued=5)
    echo = app.get_task("echo")
    async with app:
        await echo.enqueue_many([("a",)] * 3, tenant="a")
        with pytest.raises(Rejected) as caught:
            await echo.enqueue_many([("b",)] * 3, tenant="b")
        assert caught.value.reason == "lane_queue_full"
        assert caught.value.retry_after >= 1
        # the batch's other jobs are stored: 5 wait, and the lane is marked full
        state = await app.store.client.hget(app.store.keys.lane("default").state, "qb")
        assert state == b"100,5,f"
        for tenant in ("c", "d"):
            with pytest.raises(Rejected) as single:
                await echo.enqueue("c", tenant=tenant)
            assert single.value.reason == "lane_queue_full"
        # scheduled jobs count against the lane with the ready ones
        with pytest.raises(Rejected) as later:
            await echo.enqueue("later", tenant="e", delay=60)
        assert later.value.reason == "lane_queue_full"
        await app.run_worker(concurrency=8, burst=True)
        await echo.enqueue("c", tenant="c")
        await echo.enqueue("later", tenant="e", delay=60)


async def test_none_lifts_the_bounds(redis_url: str, namespace: str) -> None:
    app = bounded_app(namespace, redis_url, tenant_max_queued=None, lane_max_queued=None)
    echo = app.get_task("echo")
    async with app:
        jobs = await echo.enqueue_many([("x",)] * 40, tenant="acme")
        assert len(jobs) == 40
        state = await app.store.client.hgetall(app.store.keys.lane("default").state)
        assert b"qb" not in state  # an unbounded lane reads nothing for the bounds


async def test_one_bound_lifted_leaves_the_other(redis_url: str, namespace: str) -> None:
    app = bounded_app(namespace, redis_url, tenant_max_queued=2, lane_max_queued=None)
    echo = app.get_task("echo")
    async with app:
        await echo.enqueue_many([("x",)] * 2, tenant="acme")
        with pytest.raises(Rejected, match="tenant_queue_full"):
            await echo.enqueue("x", tenant="acme")
        for n in range(10):
            await echo.enqueue_many([("x",)] * 2, tenant=f"t{n}")


async def test_a_lane_with_a_pool_keeps_its_pools_bounds(redis_url: str, namespace: str) -> None:
    app = App(
        namespace,
        redis_url=redis_url,
        settings=fast_settings(queues={"tenant_max_queued": 2, "lane_max_queued": 2}),
        config=parse_config(pool(100, "reject")),
    )

    @app.task(name="echo", attempts=1)
    async def echo(text: str = "") -> str:
        return text

    async with app:
        # well past the default bounds, within the pool's (capacity 100 units, 1 a job)
        jobs = await echo.enqueue_many([("x",)] * 8, tenant="acme")
        assert len(jobs) == 8
        state = await app.store.client.hgetall(app.store.keys.lane("default").state)
        assert b"qb" not in state and b"adm" in state


async def test_the_gateway_answers_429_with_the_reason_and_a_retry_after(
    redis_url: str, namespace: str
) -> None:
    async with gateway(namespace, redis_url, queues={"tenant_max_queued": 1}) as gw:
        auth = await gw.key("acme")
        job = {"task": "echo", "args": ["x"]}
        assert (await gw.client.post("/v1/jobs", json=job, headers=auth)).status_code == 202
        r = await gw.client.post("/v1/jobs", json=job, headers=auth)
        assert r.status_code == 429, r.text
        assert r.json()["reason"] == "tenant_queue_full"
        assert int(r.headers["Retry-After"]) >= 1
        assert r.json()["retry_after_seconds"] >= 1
        other = await gw.key("globex")
        assert (await gw.client.post("/v1/jobs", json=job, headers=other)).status_code == 202


def misplaced_pool_app(namespace: str, redis_url: str) -> App:
    """The issue's config: a pool ``agent-shared`` while the tasks run on lane ``light``."""
    config = pool(200, "reject")
    config["pools"] = {"agent-shared": config["pools"]["default"]}
    app = App(namespace, redis_url=redis_url, settings=fast_settings(), config=parse_config(config))

    @app.task(name="agent", lane="light", attempts=1)
    async def agent() -> None:
        return None

    return app


async def test_a_pool_naming_no_lane_of_the_app_is_refused_at_connect(
    redis_url: str, namespace: str
) -> None:
    app = misplaced_pool_app(namespace, redis_url)
    with pytest.raises(ConfigError) as caught:
        async with app:
            pass
    message = str(caught.value)
    assert "'agent-shared'" in message
    assert "'default', 'light'" in message
    # nothing was written: the app never connected
    assert not app.sharded.connected


APP_SOURCE = """
from fairlane import App
from fairlane.config.pools import parse_config

POOL = {{"capacity_units": 10, "classes": {{"standard": {{"nominal_share": 1.0,
        "max_queue": 200, "tenant_max_queue": 50}}}}}}
app = App({name!r}, redis_url={url!r}, config=parse_config({{"pools": {{{pool!r}: POOL}}}}))


@app.task(lane="light")
async def agent() -> None:
    return None


@app.task
async def plain() -> None:
    return None
"""


@pytest.fixture
def module(
    tmp_path: Path, namespace: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Path, str]]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    yield tmp_path, namespace
    for name in list(sys.modules):
        if name.startswith(f"{namespace}_"):
            sys.modules.pop(name)


def write_app(where: tuple[Path, str], redis_url: str, pool_lane: str, tag: str) -> ModuleType:
    tmp_path, namespace = where
    name = f"{namespace}_{tag}"
    source = APP_SOURCE.format(name=namespace, url=redis_url, pool=pool_lane)
    (tmp_path / f"{name}.py").write_text(source)
    return importlib.import_module(name)


def invoke(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(cli, args, env=WIDE)
    return result.exit_code, result.output


def test_doctor_reports_a_pool_naming_no_lane_of_the_app(
    module: tuple[Path, str], redis_url: str
) -> None:
    wrong = write_app(module, redis_url, "agent-shared", "wrong")
    code, output = invoke(["doctor", f"{wrong.__name__}:app", "--redis-url", redis_url])
    assert code == 1, output
    row = next(line for line in output.splitlines() if "pools" in line)
    assert "ERROR" in row and "'agent-shared'" in output and "'default', 'light'" in output
    right = write_app(module, redis_url, "light", "right")
    code, output = invoke(["doctor", f"{right.__name__}:app", "--redis-url", redis_url])
    assert code == 0, output
    row = next(line for line in output.splitlines() if "pools" in line)
    assert "OK" in row and "light" in row


def test_inspect_lanes_shows_each_lanes_bounds(module: tuple[Path, str], redis_url: str) -> None:
    app = write_app(module, redis_url, "light", "lanes")
    code, output = invoke(["inspect", "lanes", f"{app.__name__}:app"])
    assert code == 0, output
    assert "queue bounds" in output
    default = next(line for line in output.splitlines() if "queues settings" in line)
    assert "100,000 ready per class queue" in default and "1,000,000 ready slots" in default
    light = next(line for line in output.splitlines() if "pool light" in line)
    assert "50 admitted in standard" in light and "200 admitted in standard" in light
