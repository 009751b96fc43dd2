"""The upstream's pushback and bad input at the call site, with real workers on private servers.

* ``Throttled(key, retry_after=1.0)`` raised by a job's first run pauses the key for
  every job on it, of any tenant: none starts before the pause ends (the server's clock:
  ``TIME`` read in the task just before it raised, and the records' starts), while a job
  on another key starts meanwhile. The job itself runs again after the pause with its
  attempt given back. Once for a rate key, once for an adaptive concurrency key.
* Past ``MAX_PUSHBACKS`` a pushback is an ordinary failed attempt, and a ``Throttled``
  naming a key the job does not hold is an ordinary failure.
* Bad rates, a rate on a tenant's reserved key, more keys than the bound, and a job whose
  units can never fit a key's burst are refused where they are written (decoration,
  enqueue, configure); the server holds exactly the keys it held before. Next to each
  bound, a call just inside it is accepted and runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fairlane import Adaptive, App, Backoff, Estimate, Rate, Throttled
from fairlane.policy.rates import MAX_PUSHBACKS
from fairlane.testing import RedisServer
from tests.e2e.helpers import WAIT, eventually, make_app, raw_client, running_worker

pytestmark = pytest.mark.anyio

KEY = "model:gpt"
OTHER = "model:other"


@pytest.fixture
def server_url() -> Iterator[str]:
    """A private server for one test."""
    with RedisServer() as server:
        yield server.url


async def server_ms(client: Any) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def start_of(app: App, job_id: str) -> int:
    record = await app.sharded.store_for_job(job_id).read_job(job_id)
    assert record is not None and record.started_ms is not None, record
    return record.started_ms


# -- Throttled pauses the key for everyone -----------------------------------------------------


# A pause on a key with no rate (limits= only) holds back the job that pushed back but
# no other arrival: the blocking rule reads a pause only through a rate's bucket (`fits`
# in docs/contracts/rates.md, `first_full` in throttle.lua), while the issue pauses "any
# key the job holds (a rate key or a throttle key of limits=)" for every job on it.
FACETS: dict[str, dict[str, Any]] = {
    "rate": {"rates": {KEY: Rate(100, per=1.0)}},
    "limit": {"limits": {KEY: 8}},
    "adaptive": {"limits": {KEY: Adaptive(max=8, min=1)}},
}


@pytest.mark.parametrize(
    "facet",
    [
        "rate",
        "limit",
        "adaptive",
    ],
)
async def test_throttled_pauses_the_key_for_everyone_and_gives_the_attempt_back(
    server_url: str, facet: str
) -> None:
    pause = 1.0
    app = make_app("pushback", server_url)
    keyed = FACETS[facet]
    runs: list[str] = []
    raised_at: list[int] = []

    async with raw_client(server_url) as client:

        @app.task(attempts=3, **keyed)
        async def call(name: str) -> str:
            runs.append(name)
            if name == "pusher" and runs.count(name) == 1:
                raised_at.append(await server_ms(client))
                raise Throttled(KEY, retry_after=pause)
            return name

        @app.task(rates={OTHER: Rate(100, per=1.0)})
        async def elsewhere() -> str:
            return "free"

        async with app, running_worker(app, concurrency=10):
            pusher = await call.enqueue("pusher", tenant="a")

            async def pushed_back() -> bool:
                return bool(raised_at) and await pusher.status() == "scheduled"

            await eventually(pushed_back)
            # arrivals after the pause began, of the same tenant and of others
            others = [
                *await call.enqueue_many([("a",)] * 3, tenant="a"),
                *await call.enqueue_many([("b",)] * 3, tenant="b"),
            ]
            free = await elsewhere.enqueue(tenant="b")
            assert await free.result(timeout=WAIT) == "free"
            for job in [pusher, *others]:
                await job.result(timeout=WAIT)
            ends = raised_at[0] + int(pause * 1000)
            free_start = await start_of(app, free.id)
            starts = {job.id: await start_of(app, job.id) for job in [pusher, *others]}
            info = await pusher.info()
            job_key = app.sharded.store_for_job(pusher.id).keys.job(pusher.id)
            pushbacks = await client.hget(job_key, "pb")

    print(f"pause ends {ends}; starts after it (ms): {[s - ends for s in starts.values()]}")
    # the pause is the key's, not the worker's: another key's job started during it
    assert free_start < ends, (free_start, ends)
    assert all(start >= ends for start in starts.values()), (ends, starts)
    assert runs.count("pusher") == 2
    assert (info.status, info.attempts) == ("completed", 1)
    assert pushbacks is not None and int(pushbacks) == 1, pushbacks  # counted apart (pb)


async def test_pushbacks_past_the_bound_count_and_a_key_not_held_is_a_failure(
    server_url: str,
) -> None:
    app = make_app("bound", server_url)
    runs: list[str] = []

    @app.task(attempts=2, backoff=Backoff(base=0.01, cap=0.02), rates={KEY: Rate(1000, per=1.0)})
    async def call(name: str) -> None:
        runs.append(name)
        # a key the job does not hold cannot be paused by it: an ordinary failure
        raise Throttled(KEY if name == "always" else OTHER, retry_after=0.02)

    async with app, running_worker(app, concurrency=4):
        always = await call.enqueue("always", tenant="a")
        stranger = await call.enqueue("stranger", tenant="b")

        async def settled() -> bool:
            return {await always.status(), await stranger.status()} == {"failed"}

        await eventually(settled)
        always_info, stranger_info = await always.info(), await stranger.info()
    # MAX_PUSHBACKS given back; the next fails attempt 1, its retry's pushback attempt 2
    assert runs.count("always") == MAX_PUSHBACKS + 2, runs.count("always")
    assert always_info.attempts == 2
    assert runs.count("stranger") == 2 and stranger_info.attempts == 2
    assert stranger_info.error is not None and OTHER in stranger_info.error


# -- bad input at the call site, nothing stored ------------------------------------------------


async def all_keys(client: Any) -> set[bytes]:
    return {key async for key in client.scan_iter(count=1000)}


def _limits(n: int, prefix: str) -> dict[str, int]:
    return {f"{prefix}:{i:02}": 5 for i in range(n)}


def _rates(n: int, prefix: str) -> dict[str, Rate]:
    return {f"{prefix}:{i:02}": Rate(100, per=1.0) for i in range(n)}


BAD_RATES: list[tuple[str, Callable[[], Rate]]] = [
    ("zero", lambda: Rate(0)),
    ("negative", lambda: Rate(-1)),
    ("nan", lambda: Rate(float("nan"))),
    ("inf limit", lambda: Rate(float("inf"))),
    ("zero period", lambda: Rate(1, per=0)),
    ("negative period", lambda: Rate(1, per=-1.0)),
    ("inf burst", lambda: Rate(1, burst=float("inf"))),
    ("zero burst", lambda: Rate(1, burst=0)),
    ("unknown cost", lambda: Rate(1, cost="tokens")),  # type: ignore[arg-type]
]


async def test_bad_rates_and_keys_are_refused_at_the_call_and_store_nothing(
    server_url: str,
) -> None:
    app = make_app("bad", server_url)
    units = Rate(10, per=1.0, burst=5, cost="units")

    @app.task(rates={KEY: units})
    async def work(i: int) -> int:
        return i

    # refused where the task is declared, before anything connects
    for rates in (
        {"tenant:acme": Rate(1)},
        _rates(17, "r"),
    ):
        with pytest.raises(ValueError):
            app.task(name=f"bad_{len(rates)}", rates=rates)(work.fn)
    with pytest.raises(ValueError, match="16"):
        app.task(name="too_many", limits=_limits(9, "k"), rates=_rates(8, "j"))(work.fn)

    async with app, raw_client(server_url) as client:
        before = await all_keys(client)
        for label, bad in BAD_RATES:
            with pytest.raises(ValueError):
                await work.enqueue(1, tenant="acme", rates={"user:acme/1": bad()})
                pytest.fail(f"{label}: Rate accepted")
        refusals: list[tuple[str, dict[str, Any]]] = [
            ("reserved key", {"rates": {"tenant:acme": Rate(1)}}),
            ("17 rates", {"rates": _rates(17, "r")}),
            ("17 keys together", {"limits": _limits(9, "k"), "rates": _rates(8, "j")}),
            # the task's rate key counts too: 16 more on the call make 17
            ("17 with the task's", {"limits": _limits(8, "k"), "rates": _rates(8, "j")}),
            (
                "units over the burst",
                {"estimate": Estimate(input_tokens=5001, max_output_tokens=0)},
            ),
        ]
        for label, options in refusals:
            with pytest.raises(ValueError) as refused:
                await work.enqueue(1, tenant="acme", **options)
            print(f"{label}: {refused.value}")
            with pytest.raises(ValueError):
                await work.enqueue_many([(1,), (2,)], tenant="acme", **options)
        with pytest.raises(ValueError, match="burst"):
            await work.enqueue(
                1, tenant="acme", estimate=Estimate(input_tokens=6000, max_output_tokens=0)
            )
        with pytest.raises(TypeError):
            await work.enqueue(1, tenant="acme", rates={"user:acme/1": 5})  # type: ignore[dict-item]
        with pytest.raises(TypeError):
            await app.tenants.configure("acme", rate=10)  # type: ignore[arg-type]
        after = await all_keys(client)
        assert after == before, sorted(after - before)

        # just inside every bound: 16 keys together (the task's one and a name in both
        # limits and rates counted once), and a cost equal to the burst
        accepted = [
            await work.enqueue(
                1,
                tenant="acme",
                limits={**_limits(8, "k"), "j:00": 50},
                rates=_rates(7, "j"),
            ),
            await work.enqueue(
                2, tenant="acme", estimate=Estimate(input_tokens=5000, max_output_tokens=0)
            ),
        ]
        async with running_worker(app, concurrency=4):
            assert [await job.result(timeout=WAIT) for job in accepted] == [1, 2]
