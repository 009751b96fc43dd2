"""The tenant sweep (``lua/tenantsweep.lua``) against its rules (``fairlane.policy.tenantstate``).

On the real server: a class's virtual time, work in flight, active tenants and idle
tenants' finish tags are written into two apps alike; one is swept. The sweep must
delete exactly the tags ``finish_tag_removable`` names, and every idle tenant, activated
afterwards through a real enqueue in both apps, must start at the same tag in both --
the one ``activation_start`` gives. Tags above ``V - r`` go only after the sweep has seen them
unchanged for the ttl; learned costs by the server's idle clock, which the sweep itself
does not reset; rejection and admission counters by their rules; a pass stays within
its bound, and a hash that held many tenants is rewritten small. The tests marked
``contract`` run on a cluster too, where a pass scans the node holding its shard's slot.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairlane import App
from fairlane.app.task import Task
from fairlane.policy.tenantstate import (
    activation_start,
    counter_empty,
    finish_tag_removable,
    rejection_expired,
)
from fairlane.store.api import Store
from fairlane.store.connection import SyncClient, create_sync_client
from fairlane.store.keys import AppKeys
from tests.e2e.helpers import fast_settings

pytestmark = pytest.mark.anyio

NEVER = 10**9  # an idle ttl (s) no test outlives
CLASS = ("default", "standard")


async def sweep_cycle(store: Store, limit: int = 500, ttl: float = NEVER) -> tuple[int, int]:
    """One whole cycle of passes; returns (passes, removed)."""
    cursor, passes, removed = "0", 0, 0
    while True:
        swept = await store.sweep_tenants(cursor, limit, ttl)
        passes, removed, cursor = passes + 1, removed + swept.removed, swept.cursor
        if cursor == "0":
            return passes, removed


@pytest.fixture
def client(redis_url: str) -> Iterator[SyncClient]:
    c = create_sync_client(redis_url, decode_responses=True)
    yield c
    c.close()


@pytest.fixture
async def pair(redis_url: str) -> AsyncIterator[list[tuple[App, Task[[], None], Store]]]:
    """Two connected apps with a no-op task, and a store of each (their keys go after)."""
    made: list[tuple[App, Task[[], None], Store]] = []
    names = [f"ts_{secrets.token_hex(4)}" for _ in range(2)]
    try:
        for name in names:
            app = App(name, redis_url=redis_url, settings=fast_settings())

            @app.task
            async def noop() -> None:
                return None

            await app.connect()
            store = Store.from_url(redis_url, name, max_connections=2)
            await store.connect()
            made.append((app, noop, store))
        yield made
    finally:
        wipe = create_sync_client(redis_url)
        for app, _, store in made:
            await store.aclose()
            await app.aclose()
            keys = list(wipe.scan_iter(match=store.keys.match_all(), count=500))
            if keys:
                wipe.delete(*keys)
        wipe.close()


def write_class(c: SyncClient, keys: AppKeys, state: dict[str, Any]) -> None:
    vt, fair = (keys.class_key(*CLASS, what) for what in ("vt", "fair"))
    c.delete(vt, fair, keys.class_key(*CLASS, "seen"))
    c.hset(vt, mapping={"V": repr(state["V"]), "run": repr(state["run"])})
    for i in range(state["active"]):
        c.zadd(fair, {f"busy-{i}": state["V"] + i})
    for tenant, tag in state["idle"].items():
        c.hset(vt, f"f:{tenant}", repr(tag))


class_states = st.fixed_dictionaries(
    {
        "V": st.integers(0, 400).map(lambda n: n / 4),
        "run": st.integers(0, 40).map(lambda n: n / 2),
        "active": st.integers(0, 4),
        "offsets": st.lists(st.integers(-120, 20).map(lambda n: n / 4), min_size=1, max_size=6),
    }
)


@pytest.mark.contract
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(state=class_states)
async def test_the_sweep_removes_exactly_the_neutral_finish_tags_and_changes_no_start(
    pair: list[tuple[App, Task[[], None], Store]], client: SyncClient, state: dict[str, Any]
) -> None:
    (_, task_a, swept), (_, task_b, kept) = pair
    tag = secrets.token_hex(3)
    state["idle"] = {f"idle-{tag}-{i}": state["V"] + d for i, d in enumerate(state["offsets"])}
    for store in (swept, kept):
        write_class(client, store.keys, state)
    await sweep_cycle(swept)

    vt = swept.keys.class_key(*CLASS, "vt")
    seen = client.hgetall(swept.keys.class_key(*CLASS, "seen"))
    for tenant, finish in state["idle"].items():
        removable = finish_tag_removable(finish, state["V"], state["run"])
        assert client.hexists(vt, f"f:{tenant}") != removable, (tenant, finish, state)
        # a tag left above V - r is marked with its first sighting
        assert (tenant in seen) != removable

    # every idle tenant comes back, in both apps: the same start, the policy's
    for n, (tenant, finish) in enumerate(state["idle"].items()):
        await task_a.enqueue(tenant=tenant)
        await task_b.enqueue(tenant=tenant)
        starts = [
            client.zscore(store.keys.class_key(*CLASS, "fair"), tenant) for store in (swept, kept)
        ]
        expected = activation_start(finish, state["V"], state["run"], state["active"] + n)
        assert starts[0] == starts[1] == pytest.approx(expected, abs=1e-9), (tenant, state)


async def test_a_tag_above_v_goes_once_seen_unchanged_for_the_ttl(
    store: Store, client: SyncClient
) -> None:
    keys = store.keys
    vt, seen = keys.class_key(*CLASS, "vt"), keys.class_key(*CLASS, "seen")
    write_class(client, keys, {"V": 5.0, "run": 0.0, "active": 0, "idle": {"a": 6.0, "b": 7.0}})
    await sweep_cycle(store)
    assert set(client.hgetall(seen)) == {"a", "b"}
    client.hset(vt, "f:b", "8")  # b came back and left again: its tag changed
    client.hset(seen, "gone", "9|1")  # a mark whose tag is no longer there
    await sweep_cycle(store, ttl=0)
    assert not client.hexists(vt, "f:a")  # seen unchanged: forgotten
    assert client.hget(vt, "f:b") == "8"  # seen anew instead
    assert client.hget(seen, "b").startswith("8|")
    assert not client.hexists(seen, "a")
    assert not client.hexists(seen, "gone")
    await sweep_cycle(store, ttl=0)
    assert client.hkeys(vt) == ["V", "run"] or set(client.hkeys(vt)) == {"V", "run"}
    assert not client.exists(seen)


@pytest.mark.contract
async def test_learned_costs_go_by_the_servers_idle_clock_which_the_sweep_does_not_reset(
    store: Store, client: SyncClient
) -> None:
    p = store.keys.prefix
    client.hset(f"{p}cost:old|task|", mapping={"mean": 1000, "n": 3})
    client.hset(f"{p}cost:fresh|task|", mapping={"mean": 1000, "n": 3})
    client.hset(f"{p}sig:old", mapping={"dm": 0.5, "dn": 4})
    await asyncio.sleep(2.2)
    client.hget(f"{p}cost:fresh|task|", "mean")  # read by an enqueue: not idle
    _, removed = await sweep_cycle(store, ttl=1.0)
    assert removed == 1
    assert not client.exists(f"{p}cost:old|task|")
    assert client.exists(f"{p}cost:fresh|task|")
    # signals wait for the rate window (60 s) too; the sweep's look did not touch them
    assert client.exists(f"{p}sig:old")
    assert client.object("idletime", f"{p}sig:old") >= 2
    await sweep_cycle(store, ttl=1.0)
    assert client.object("idletime", f"{p}sig:old") >= 2


@pytest.mark.contract
async def test_counters_go_by_their_rules(store: Store, client: SyncClient) -> None:
    p = store.keys.prefix
    now = int(client.time()[0]) * 1000
    rejections = {
        "late": f"4|{now - 61_000}",
        "recent": f"2|{now - 1_000}",
        "ahead": f"1|{now + 30_000}",
        "junk": "x",
    }
    counts = {"standard|a": "0", "standard|b": "2", "standard|c": "-1"}
    client.hset(store.keys.lane_rejections("default"), mapping=rejections)
    client.hset(f"{p}lane:default:adm:t", mapping=counts)
    client.hset(f"{p}lane:default:adm:tu", mapping=counts)
    await sweep_cycle(store)
    now = int(client.time()[0]) * 1000
    left = client.hgetall(store.keys.lane_rejections("default"))
    assert set(left) == {t for t, v in rejections.items() if not rejection_expired(v, now)}
    assert set(left) == {"recent", "ahead"}
    for what in ("t", "tu"):
        left = client.hgetall(f"{p}lane:default:adm:{what}")
        assert set(left) == {k for k, v in counts.items() if not counter_empty(v)}


#: what the steps of SCAN and HSCAN in one pass may return beyond their COUNTs: each step
#: ends on a whole bucket's chain, and while a table is being rehashed a step takes one
#: bucket of the smaller table with every bucket it expands to in the larger one (209
#: for a limit of 100 was seen once, past an earlier slack of 8)
CHAIN_SLACK = 32


async def test_a_pass_is_bounded_and_a_hash_of_many_tenants_is_written_small_again(
    store: Store, client: SyncClient
) -> None:
    keys, p = store.keys, store.keys.prefix
    state = {"V": 100.0, "run": 0.0, "active": 0, "idle": {f"t{i}": 1.0 for i in range(3000)}}
    write_class(client, keys, state)
    client.hset(keys.class_key(*CLASS, "vt"), "f:ahead", "101")
    for i in range(300):
        client.hset(f"{p}cost:t{i}|task|", "mean", 5)
    vt = keys.class_key(*CLASS, "vt")
    assert client.object("encoding", vt) == "hashtable"
    cursor, passes, removed = "0", 0, 0
    while True:
        swept = await store.sweep_tenants(cursor, 100, NEVER)
        passes, removed, cursor = passes + 1, removed + swept.removed, swept.cursor
        # HSCAN's COUNT is a hint and SCAN's a bucket count: a step returns whole buckets,
        # so a pass may pass the bound by a bucket's chain (201 was seen once, in CI)
        assert swept.examined <= 2 * 100 + CHAIN_SLACK
        assert swept.idle_clock
        if cursor == "0":
            break
    assert removed == 3000
    assert passes >= 3000 // 200
    assert set(client.hkeys(vt)) == {"V", "run", "f:ahead"}
    assert client.object("encoding", vt) == "listpack"
    assert client.hget(vt, "f:ahead") == "101"
