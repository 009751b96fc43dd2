"""The direct hand-off (``lua/handoff.lua``) against the long way it shortens.

An enqueue whose one job is all its lane has waiting, with a worker idle, leases it to
that worker without passing it through its queue and a dispatch. The two ways must leave
the same state. Two apps run the same operations on one server: in one the direct
hand-off applies; in the other a concurrency limit on a tenant that never submits (which
changes nothing for the tenants that do) sends every enqueue the long way, through the
push and a dispatch of one slot. After every operation the apps' keys must match, up to
the clock's readings and that one setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from redis.asyncio.cluster import RedisCluster

from fairlane import App
from fairlane.store.api import Store
from fairlane.store.wire import NewJob, Outcome

pytestmark = [pytest.mark.anyio, pytest.mark.contract]

WORKER, SLOTS, LEASE_MS = "w", 2, 60_000
TENANTS = ("a", "b", "c")
CLASSES = ("standard", "guaranteed", "batch")
# the fields that read the clock: when a job was stored, started, finished
CLOCK_FIELDS = {b"enq", b"start", b"fin", b"run"}
# sets scored by the clock: only their members are compared
CLOCKED_SETS = (b"leases", b"workers", b"beats", b"idle", b"kept:", b"delayed", b"gone")

Op = tuple[str, int, int]
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("enqueue"), st.integers(0, 2), st.integers(0, 2)),
        st.tuples(st.just("idle"), st.just(0), st.just(0)),
        st.tuples(st.just("settle"), st.just(0), st.just(0)),
    ),
    min_size=1,
    max_size=14,
)


ENQ, IDLE, SETTLE = ("enqueue", 0, 0), ("idle", 0, 0), ("settle", 0, 0)


class Side:
    """One app and its worker's view: the jobs it holds."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.held: list[Any] = []
        self.n = 0

    @property
    def store(self) -> Store:
        return self.app.store

    async def apply(self, op: Op) -> None:
        kind, t, c = op
        if kind == "enqueue":
            self.n += 1
            job = NewJob(
                f"job{self.n:03d}", TENANTS[t], 0, "h.job", "[]", 3, "", 300, "0,0", "0,0",
                service_class=CLASSES[c],
            )  # fmt: skip
            await self.store.enqueue("default", [job])
            return
        outcomes: Sequence[Outcome] = ()
        if kind == "settle" and self.held:
            j = self.held.pop(0)
            outcomes = [Outcome(j.id, j.token, "ok", "1", cost=0.004)]
        want = SLOTS - len(self.held) if kind == "idle" else 0
        got = await self.store.exchange(
            WORKER, ["default"], want, LEASE_MS, outcomes, idle_ms=60_000, slots=SLOTS
        )
        self.held.extend(got.jobs)

    async def snapshot(self) -> dict[bytes, Any]:
        client, keys = self.store.client, self.store.keys
        out: dict[bytes, Any] = {}
        async for key in client.scan_iter(match=keys.match_all(), count=500):
            name = key.split(b"}", 1)[1].lstrip(b":")
            if name == b"tlimits":
                continue
            out[name] = await _value(client, key, name)
        return out


async def _hash(client: Any, key: bytes, name: bytes) -> Any:
    h = await client.hgetall(key)
    if name.startswith(b"job:"):
        return {k: v for k, v in h.items() if k not in CLOCK_FIELDS}
    if b":starts" in name:
        return sum(int(v) for v in h.values())
    # a count at nought reads as an absent one
    return {k: v for k, v in h.items() if v != b"0"}


async def _zset(client: Any, key: bytes, name: bytes) -> Any:
    scored = await client.zrange(key, 0, -1, withscores=True)
    if any(part in name for part in CLOCKED_SETS):
        return sorted(m for m, _ in scored)
    return scored


async def _list(client: Any, key: bytes, name: bytes) -> Any:
    rows = await client.lrange(key, 0, -1)
    # an inbox row: the job's id first (its other places hold the clock's readings)
    return [msgspec.msgpack.decode(r)[0] if name.startswith(b"inbox:") else r for r in rows]


async def _set(client: Any, key: bytes, name: bytes) -> Any:
    return sorted(await client.smembers(key))


async def _string(client: Any, key: bytes, name: bytes) -> Any:
    return await client.get(key)


READERS = {b"hash": _hash, b"zset": _zset, b"list": _list, b"set": _set, b"string": _string}


async def _value(client: Any, key: bytes, name: bytes) -> Any:
    kind = await client.type(key)
    return await READERS[kind](client, key, name)


def _same(direct: dict[bytes, Any], long: dict[bytes, Any]) -> None:
    assert direct.keys() == long.keys()
    for key, value in direct.items():
        assert value == long[key], key


async def _pair(redis_url: str, namespace: str, charge: str) -> tuple[Side, Side]:
    direct = App(f"{namespace}d", redis_url=redis_url, charge=charge)  # type: ignore[arg-type]
    long = App(f"{namespace}l", redis_url=redis_url, charge=charge)  # type: ignore[arg-type]
    for app in (direct, long):
        await app.__aenter__()
        await app.tenants.configure("b", weight=3)
    await long.tenants.configure("nobody", max_concurrency=5)
    return Side(direct), Side(long)


@pytest.mark.parametrize("charge", ["cost", "jobs"])
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=OPS)
# the worker idle with every slot held: the class may not start the job (no free slot)
@example(ops=[ENQ, IDLE, ENQ, IDLE, IDLE, ENQ, SETTLE, IDLE])
# a tenant that ran before (its finish tag), a heavier one, and another class
@example(
    ops=[IDLE, ENQ, IDLE, SETTLE, IDLE, ("enqueue", 1, 0), IDLE, SETTLE, IDLE, ("enqueue", 0, 1)]
)
async def test_a_direct_hand_off_leaves_what_the_long_way_does(
    redis_url: str, namespace: str, charge: str, ops: list[Op]
) -> None:
    direct, long = await _pair(redis_url, f"{namespace}{len(ops)}{charge[0]}", charge)
    try:
        for op in ops:
            await direct.apply(op)
            await long.apply(op)
            assert [j.id for j in direct.held] == [j.id for j in long.held]
            _same(await direct.snapshot(), await long.snapshot())
    finally:
        for side in (direct, long):
            client = side.store.client
            stale = [k async for k in client.scan_iter(match=side.store.keys.match_all())]
            if stale:
                await client.delete(*stale)
            await side.app.__aexit__(None, None, None)


async def test_a_lone_job_goes_the_short_way(store: Store) -> None:
    """The case it is for: an idle worker, an empty lane, a plain job. The job is leased
    to the worker's inbox and never enters its queue (which is why the agreement above is
    about something). Counted on one server's command statistics."""
    if isinstance(store.client, RedisCluster):
        pytest.skip("the command counts of one node")
    await store.exchange(WORKER, ["default"], SLOTS, LEASE_MS, idle_ms=60_000, slots=SLOTS)
    calls_before = await _calls(store, "zadd")
    job = NewJob("lone", "a", 0, "h.job", "[]", 3, "", 300, "0,0", "0,0")
    await store.enqueue("default", [job])
    # the long way adds the job to its queue and its tenant to the fair set: two ZADDs
    # more than the lease's one
    assert await _calls(store, "zadd") - calls_before == 1
    assert await store.client.llen(store.keys.inbox(WORKER)) == 1


async def _calls(store: Store, command: str) -> int:
    stats = await store.client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))
