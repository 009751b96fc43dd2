"""Admission control end to end: reservations, bounds, deferral, Retry-After and retries.

Every test declares its pool in a config (``App(config=...)``), talks to a real server
and reads the lane's admission state from its hash: ``ar:<class>`` (reserved
milli-units), ``an:<class>`` (admitted unfinished jobs), ``ad:<class>`` (deferred jobs).
Checks count decisions and read state; no test asserts on timing, and every wait is
bounded.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from fairlane import App, Backoff, Job
from fairlane.app.admission import Admission, Rejected
from fairlane.config.pools import parse_config
from fairlane.policy.admission import Estimate
from fairlane.testing import RedisServer
from tests.e2e.admission_proc import build_app
from tests.e2e.helpers import ROOT, WAIT, app_keys, eventually, fast_settings, running_worker

pytestmark = pytest.mark.anyio

LANE = "default"


def pool(capacity: float, classes: dict[str, dict[str, Any]], **top: Any) -> dict[str, Any]:
    """A config of one pool on the default lane; reservations are the declared units."""
    config: dict[str, Any] = {
        "pools": {LANE: {"capacity_units": capacity, "classes": classes}},
        "estimation": {"safety_multiplier": 1.0},
    }
    config.update(top)
    return config


def admission_app(namespace: str, redis_url: str, config: dict[str, Any]) -> App:
    settings = fast_settings()
    return App(namespace, redis_url=redis_url, settings=settings, config=parse_config(config))


async def lane_state(app: App) -> dict[str, int]:
    """The lane's admission counters (``ar:``, ``an:``, ``ad:`` fields), absent ones left out."""
    raw = await app.store.client.hgetall(app.store.keys.lane(LANE).state)
    out = {}
    for key, value in raw.items():
        name = key.decode() if isinstance(key, bytes) else key
        if name.split(":", 1)[0] in ("ar", "an", "ad"):
            out[name] = int(value)
    return out


async def counter(app: App, name: str) -> int:
    return (await lane_state(app)).get(name, 0)


# -- 1. concurrent submitters in several processes ---------------------------------------------

RACE_PROCESSES = 6
RACE_EACH = 25  # 150 submissions for 50 units
RACE_CONFIG = pool(
    50,
    {"standard": {"nominal_share": 1.0, "max_queue": 10_000, "response_when_full": "reject"}},
)


async def test_racing_processes_never_reserve_beyond_capacity(
    redis_url: str, namespace: str
) -> None:
    app, noop = build_app(namespace, redis_url, RACE_CONFIG)
    peak = 0
    async with app:
        go = f"{app.store.keys.prefix}test:go"
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.e2e.admission_proc",
                redis_url,
                namespace,
                json.dumps(RACE_CONFIG),
                str(RACE_EACH),
                f"tenant{i % 3}",
                go,
                cwd=ROOT,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            for i in range(RACE_PROCESSES)
        ]
        try:

            async def all_ready() -> bool:
                return int(await app.store.client.get(f"{go}:ready") or 0) == RACE_PROCESSES

            await eventually(all_ready, timeout=60)
            await app.store.client.set(go, 1)
            outputs = asyncio.gather(*(p.communicate() for p in procs))
            async with asyncio.timeout(60):
                while not outputs.done():
                    peak = max(peak, await counter(app, "ar:standard"))
                    await asyncio.sleep(0.001)
                results = await outputs
        finally:
            for p in procs:
                if p.returncode is None:
                    p.kill()
                    await p.wait()
        decisions: list[list[Any]] = []
        for p, (out, err) in zip(procs, results, strict=True):
            assert p.returncode == 0, err.decode()
            decisions.extend(json.loads(out))
        assert len(decisions) == RACE_PROCESSES * RACE_EACH
        accepted = [job_id for status, _, job_id in decisions if status == "accepted"]
        others = [(status, reason) for status, reason, _ in decisions if status != "accepted"]
        assert len(accepted) == 50
        assert set(others) == {("rejected", "class_full")}
        assert len(others) == RACE_PROCESSES * RACE_EACH - 50
        # never above capacity, while racing or after
        assert peak <= 50_000
        state = await lane_state(app)
        assert state["ar:standard"] == 50_000
        assert state["an:standard"] == 50
        # a real worker finishes the accepted jobs; every reservation is given back
        async with running_worker(app, concurrency=20):
            for job_id in accepted:
                await Job(noop, job_id).result(timeout=WAIT)
        state = await lane_state(app)
        assert state.get("ar:standard", 0) == 0
        assert state.get("an:standard", 0) == 0
        # and the released capacity is taken again at once: 50 more fit, the 51st does not
        again = [await noop.submit(i, tenant="again", estimate=1.0) for i in range(51)]
        assert [a.status for a in again] == ["accepted"] * 50 + ["rejected"]
        assert again[-1].reason == "class_full"
        assert await counter(app, "ar:standard") == 50_000


# -- 2. queue bounds -------------------------------------------------------------------------

BOUNDS_CONFIG = pool(
    1000,
    {
        "guaranteed": {"nominal_share": 0.4, "max_queue": 200, "response_when_full": "reject"},
        "standard": {"nominal_share": 0.4, "max_queue": 200, "response_when_full": "defer"},
        "shared": {
            "nominal_share": 0.2,
            "max_queue": 100,
            "tenant_max_queue": 5,
            "response_when_full": "reject",
        },
    },
)


@pytest.mark.contract
async def test_queue_bounds_reject_or_defer_and_tenant_bound_is_per_tenant(
    redis_url: str, namespace: str
) -> None:
    app = admission_app(namespace, redis_url, BOUNDS_CONFIG)

    @app.task
    async def noop(n: int) -> int:
        return n

    async with app:
        for cls in ("guaranteed", "standard"):
            first = [
                await noop.submit(i, tenant=f"t{i % 7}", service_class=cls) for i in range(200)
            ]
            assert {a.status for a in first} == {"accepted"}, cls
        # the 201st: refused in the reject class, stored and deferred in the defer class
        refused = await noop.submit(200, tenant="t0", service_class="guaranteed")
        assert (refused.status, refused.reason, refused.job) == (
            "rejected",
            "class_queue_full",
            None,
        )
        assert refused.retry_after is not None and refused.retry_after >= 1
        deferred = await noop.submit(200, tenant="t0", service_class="standard")
        assert (deferred.status, deferred.reason) == ("deferred", "class_queue_full")
        assert deferred.job is not None and await deferred.job.status() == "deferred"
        # one tenant at its bound leaves another's submissions alone
        hog = [await noop.submit(i, tenant="hog", service_class="shared") for i in range(6)]
        assert [a.status for a in hog] == ["accepted"] * 5 + ["rejected"]
        assert hog[-1].reason == "tenant_queue_full"
        calm = [await noop.submit(i, tenant="calm", service_class="shared") for i in range(5)]
        assert {a.status for a in calm} == {"accepted"}
        state = await lane_state(app)
    assert state["ar:guaranteed"] == 200_000 and state["an:guaranteed"] == 200
    assert state["ar:standard"] == 200_000 and state["ad:standard"] == 1
    assert state["ar:shared"] == 10_000 and state["an:shared"] == 10


# -- 3. deferred jobs: fair by tenant, FIFO within, kept across a worker and a store restart ---

FIFO_CONFIG = pool(
    1,
    {"standard": {"nominal_share": 1.0, "max_queue": 100, "response_when_full": "defer"}},
)
FIFO_JOBS = 12


@asynccontextmanager
async def fifo_app(url: str, ran: list[int]) -> AsyncIterator[tuple[App, Any]]:
    app = admission_app("fifo", url, FIFO_CONFIG)

    @app.task(name="step")
    async def step(n: int) -> int:
        ran.append(n)
        await asyncio.sleep(0.02)
        return n

    async with app:
        yield app, step


# one unit of room, jobs of t0, t1, t2 in turn: job 0 runs, the rest are deferred and
# admitted one at a time by fair deferral -- equal weights and charges, so the tenants
# take turns (ties by name: t0 first), each tenant's own jobs in submission order
FAIR_ORDER = [0, 3, 1, 2, 6, 4, 5, 9, 7, 8, 10, 11]


async def test_deferred_jobs_run_fairly_by_tenant_across_worker_and_store_restarts() -> None:
    ran: list[int] = []
    with RedisServer(appendonly=True) as server:
        async with fifo_app(server.url, ran) as (app, step):
            # one unit of room: the first job is accepted, the rest are deferred
            answers = [await step.submit(n, tenant=f"t{n % 3}") for n in range(FIFO_JOBS)]
            assert [a.status for a in answers] == ["accepted"] + ["deferred"] * (FIFO_JOBS - 1)
            ids = [a.job.id for a in answers if a.job is not None]
            async with running_worker(app, concurrency=4):
                await eventually(lambda: asyncio.sleep(0, len(ran) >= 4))
            # the worker stopped gracefully: what it started is finished; the rest is
            # admitted (at most one, holding the one unit) or still deferred
            done = len(ran)
            assert done < FIFO_JOBS
            stopped = await lane_state(app)
            admitted = stopped.get("an:standard", 0)
            assert admitted <= 1 and stopped.get("ar:standard", 0) == 1000 * admitted
            assert stopped["ad:standard"] == FIFO_JOBS - done - admitted
        server.restart()  # SIGTERM: the AOF is written out; a new process reads it back
        async with fifo_app(server.url, ran) as (app, step):
            assert await lane_state(app) == stopped
            left = [ids[n] for n in FAIR_ORDER[done:]]
            statuses = [await Job(step, job_id).status() for job_id in left]
            assert statuses.count("deferred") == FIFO_JOBS - done - admitted, statuses
            async with running_worker(app, concurrency=4):
                for job_id in ids:
                    await Job(step, job_id).result(timeout=WAIT)
            state = await lane_state(app)
    # fair across tenants, FIFO within each, none lost, none run twice; the tags kept
    # across the restart
    assert ran == FAIR_ORDER
    assert state.get("ar:standard", 0) == 0
    assert state.get("an:standard", 0) == 0
    assert state.get("ad:standard", 0) == 0


# -- 4. Retry-After ---------------------------------------------------------------------------

RETRY_CONFIG = pool(
    1,
    {"standard": {"nominal_share": 1.0, "max_queue": 100, "response_when_full": "reject"}},
    retry={"base_seconds": 2.0, "max_seconds": 30.0},
)


def band(n: int, base: float = 2.0, cap: float = 30.0) -> tuple[float, float]:
    """Where the retry_after after ``n`` earlier rejections may fall (+-30 % jitter)."""
    raw = min(cap, base * 2**n)
    return min(cap, max(1.0, raw * 0.7)), min(cap, max(1.0, raw * 1.3))


async def test_retry_after_grows_per_tenant_is_jittered_and_capped(
    redis_url: str, namespace: str
) -> None:
    app = admission_app(namespace, redis_url, RETRY_CONFIG)

    @app.task
    async def noop(n: int) -> int:
        return n

    async with app:
        assert (await noop.submit(0, tenant="busy")).status == "accepted"  # the lane is full
        waits = []
        for n in range(8):
            adm = await noop.submit(n, tenant="busy")
            assert (adm.status, adm.reason) == ("rejected", "class_full")
            assert adm.retry_after is not None
            waits.append(adm.retry_after)
        for n, wait in enumerate(waits):
            low, high = band(n)
            assert low <= wait <= high, (n, waits)
            if n:
                # later ones sit above the earlier ones' lower bound; here the +-30 % bands
                # do not overlap until the cap, so the waits grow strictly until then
                assert wait >= band(n - 1)[0], (n, waits)
        assert waits[:5] == sorted(waits[:5]) and len(set(waits[:5])) == 5, waits
        assert max(waits) <= 30.0 and min(waits[4:]) >= 21.0, waits
        # enqueue raises instead, with the same kind of answer
        with pytest.raises(Rejected) as info:
            await noop.enqueue(9, tenant="busy")
        assert info.value.reason == "class_full"
        assert band(8)[0] <= info.value.retry_after <= 30.0
        # callers refused together are told different waits: each tenant's first rejection
        firsts = [(await noop.submit(0, tenant=f"caller{i}")).retry_after for i in range(12)]
        assert all(f is not None and band(0)[0] <= f <= band(0)[1] for f in firsts), firsts
        assert len(set(firsts)) == len(firsts), firsts


# -- 5. bad input -----------------------------------------------------------------------------

BAD_CONFIG = pool(
    10,
    {"standard": {"nominal_share": 1.0, "max_queue": 100, "response_when_full": "defer"}},
    estimation={"safety_multiplier": 1.0, "max_reservation_units": 5},
)


async def test_bad_input_raises_and_reserves_nothing(redis_url: str, namespace: str) -> None:
    app = admission_app(namespace, redis_url, BAD_CONFIG)

    @app.task
    async def noop(n: int) -> int:
        return n

    async with app:
        before = await lane_state(app)
        calls: list[tuple[type[Exception], dict[str, Any]]] = [
            (ValueError, {"estimate": -1.0}),
            (ValueError, {"estimate": -0.001}),
            (ValueError, {"estimate": math.nan}),
            (ValueError, {"estimate": math.inf}),
            (TypeError, {"estimate": "3"}),
            (TypeError, {"estimate": True}),
            (TypeError, {"estimate": [1.0]}),
            (TypeError, {"estimate": {"input_tokens": 10}}),
            (ValueError, {"service_class": "nope"}),
            (TypeError, {"service_class": 7}),
            (ValueError, {"tenant": ""}),
        ]
        for kind, options in calls:
            with pytest.raises(kind):
                await noop.submit(1, **options)
            with pytest.raises(kind):
                await noop.enqueue(1, **options)
        with pytest.raises(TypeError):
            await noop.submit("one", estimate=1.0)  # the task's own argument types
        # an Estimate refuses absurd or ill-typed parts when it is made
        parts: list[tuple[dict[str, Any], type[Exception]]] = [
            ({"input_tokens": -1}, ValueError),
            ({"max_output_tokens": 10**9 + 1}, ValueError),
            ({"tool_calls": 10**7}, ValueError),
            ({"tool_seconds": -0.5}, ValueError),
            ({"tool_seconds": math.inf}, ValueError),
            ({"input_tokens": 1.5}, TypeError),
            ({"model": ""}, TypeError),
            ({"workflow": 3}, TypeError),
        ]
        for bad, kind in parts:
            with pytest.raises(kind):
                Estimate(**bad)
        # absurd but well-formed: refused by the gate (too_wide), nothing stored
        huge: list[Admission[int]] = [
            await noop.submit(1, estimate=1e9),
            await noop.submit(1, estimate=5.001),
            await noop.submit(1, estimate=Estimate(input_tokens=10**9, max_output_tokens=10**9)),
        ]
        assert [(a.status, a.reason) for a in huge] == [("rejected", "too_wide")] * 3
        with pytest.raises(Rejected) as info:
            await noop.enqueue(1, estimate=50.0)
        assert info.value.reason == "too_wide"
        assert await lane_state(app) == before
        assert await app_keys(redis_url, namespace, "job:*") == set()
        assert await app_keys(redis_url, namespace, f"lane:{LANE}:c:*") == set()
        # the largest allowed reservation still goes through
        ok = await noop.submit(1, estimate=5.0)
        assert ok.status == "accepted"
        assert await counter(app, "ar:standard") == 5000


# -- 6. retries pass the gate again -----------------------------------------------------------

RETRY_GATE_CONFIG = pool(
    2,
    {"standard": {"nominal_share": 1.0, "max_queue": 100, "response_when_full": "defer"}},
)


@pytest.mark.contract
async def test_a_retry_keeps_its_identity_and_is_deferred_while_the_class_is_full(
    redis_url: str, namespace: str
) -> None:
    app = admission_app(namespace, redis_url, RETRY_GATE_CONFIG)
    flaky_started, fail_now, release = asyncio.Event(), asyncio.Event(), asyncio.Event()
    blockers_running: list[str] = []
    attempts: list[int] = []

    @app.task(attempts=3, backoff=Backoff(0.1, 0.1, "none"))
    async def flaky(tag: str) -> str:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            flaky_started.set()
            await fail_now.wait()
            raise RuntimeError("first attempt fails")
        return tag

    @app.task
    async def blocker(tag: str) -> str:
        blockers_running.append(tag)
        await release.wait()
        return tag

    async with app:
        first = await flaky.submit("a", tenant="acme", idempotency_key="flaky-1")
        b1 = await blocker.submit("b1", tenant="other")
        assert (first.status, b1.status) == ("accepted", "accepted")  # 2 of 2 units
        assert first.job is not None and b1.job is not None
        async with running_worker(app, concurrency=4):
            async with asyncio.timeout(WAIT):
                await flaky_started.wait()
            b2 = await blocker.submit("b2", tenant="other")
            assert (b2.status, b2.reason) == ("deferred", "class_full")
            assert b2.job is not None
            # the failure gives the flaky job's unit back: b2 takes it at once, so the
            # retry, when due, finds the class full and is deferred (never rejected)
            fail_now.set()
            job = first.job
            await eventually(lambda: _status_is(job, "deferred"))
            await eventually(lambda: asyncio.sleep(0, len(blockers_running) == 2))
            state = await lane_state(app)
            assert (state["ar:standard"], state["an:standard"], state["ad:standard"]) == (
                2000,
                2,
                1,
            )
            info = await job.info()
            assert (info.tenant, info.service_class, info.attempts) == ("acme", "standard", 1)
            record = await app.store.job_record(job.id)
            assert record.get("idem") == b"flaky-1"
            again = await flaky.submit("a", tenant="acme", idempotency_key="flaky-1")
            assert again.job is not None and again.job.id == job.id and not again.job.created
            # room frees: the deferred retry is admitted and runs
            release.set()
            assert await job.result(timeout=WAIT) == "a"
            assert await b1.job.result(timeout=WAIT) == "b1"
            assert await b2.job.result(timeout=WAIT) == "b2"
        info = await job.info()
        state = await lane_state(app)
    assert attempts == [1, 2]
    assert (info.status, info.tenant, info.service_class, info.attempts) == (
        "completed",
        "acme",
        "standard",
        2,
    )
    assert state.get("ar:standard", 0) == 0
    assert state.get("an:standard", 0) == 0
    assert state.get("ad:standard", 0) == 0


async def _status_is(job: Job[Any], status: str) -> bool:
    return await job.status() == status
