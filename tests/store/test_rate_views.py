"""The rate keys' read model (``fairlane.store.views.rates``): the plan fed replies by
hand (no server), then on a real server, the state written by the real scripts.

What is pinned: a key's tokens are its level on the server's clock, not the stored
``t``; a pause shows only while it lasts; a key in force with no state left is a full
bucket; an index entry with nothing left behind it is trimmed, and nothing else is;
a key's waiters are its own (not those of a key its name is a prefix of); shards are
summed; a job's rate fields decode leniently.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import pytest

from fairlane import App
from fairlane.policy.rates import Adaptive, Rate
from fairlane.store.connection import create_sync_client
from fairlane.store.keys import AppKeys
from fairlane.store.reads import Cmd, Plan, run_sync
from fairlane.store.views.rates import (
    JobRates,
    RateKeys,
    RateKeyView,
    decode_job_rates,
    parse_adaptive,
    parse_rate,
    rate_keys,
)
from tests.e2e.helpers import WAIT, eventually, make_app, running_worker

T = Any


def drive(plan: Plan[T], *replies: list[Any]) -> tuple[T, list[list[Cmd]]]:
    """Run ``plan`` on the given replies, one list per round trip; the result and the
    batches it asked for."""
    asked: list[list[Cmd]] = []
    for reply in (None, *replies):
        if reply is not None:
            assert len(reply) == len(asked[-1]), asked[-1]
        try:
            asked.append(next(plan) if reply is None else plan.send(reply))
        except StopIteration as done:
            return done.value, asked
    raise AssertionError(f"the plan asked for more: {asked[-1]}")


def shard_keys(count: int) -> list[AppKeys]:
    return [AppKeys.for_shard("rates", i, count) for i in range(count)]


def key_reads(
    state: dict[bytes, bytes],
    rate: bytes | None = None,
    adaptive: bytes | None = None,
    due: float | None = None,
    waiters: Sequence[bytes] = (),
) -> list[Any]:
    """One key's replies in the second round trip: its hash, its in-force fields, its
    due time, its waiters' count and first ones."""
    return [state, [rate, adaptive], due, len(waiters), list(waiters)]


def test_a_keys_tokens_are_its_level_now_and_its_pause_shows_while_it_lasts() -> None:
    now = 10_000
    state = {
        b"t": b"0.5",
        b"s": b"9750",
        b"pu": b"12000",
        b"pc": b"429 from upstream",
        b"ta": b"12",
        b"tr": b"1.5",
        b"td": b"0.25",
        b"pn": b"2",
        b"wn": b"4",
        b"wt": b"900",
    }
    waiting = [b"model:x\0acme\x001\0j1", b"model:x\0beta\x002\0j2"]
    got, asked = drive(
        rate_keys(shard_keys(1)),
        [[(b"model:x", 9750.0)], 1, now],
        key_reads(state, b"4,1000,8,0", None, 12000.0, waiting),
    )
    assert len(asked) == 2  # nothing to trim: no third round trip
    (view,) = got.keys
    assert view.rate == Rate(4, per=1.0, burst=8)
    assert view.tokens == pytest.approx(0.5 + 250 * 4 / 1000)  # refilled since its stamp
    assert (view.paused, view.paused_until_ms, view.pause_cause) == (
        True,
        12000,
        "429 from upstream",
    )
    assert (view.taken, view.refunded, view.debt, view.pushbacks) == (12.0, 1.5, 0.25, 2)
    assert (view.woken, view.waited_ms, view.waiters, view.head) == (4, 900, 2, ("j1", "j2"))
    assert view.due_ms == 12000 and view.next_tokens_ms() == 12000  # the pause's end
    # the same key once its pause is over: no pause, no cause, a level capped at the burst
    later, _ = drive(
        rate_keys(shard_keys(1)),
        [[(b"model:x", 9750.0)], 1, 60_000],
        key_reads(state, b"4,1000,8,0"),
    )
    (view,) = later.keys
    assert (view.paused, view.paused_until_ms, view.pause_cause) == (False, None, "")
    assert view.tokens == 8.0 and view.next_tokens_ms() == 60_000


def test_a_debt_reads_below_zero_and_says_when_the_next_token_is_due() -> None:
    got, _ = drive(
        rate_keys(shard_keys(1)),
        [[(b"k", 1000.0)], 1, 1000],
        key_reads({b"t": b"-3", b"s": b"1000"}, b"2,1000,2,1"),
    )
    (view,) = got.keys
    assert view.rate is not None and view.rate.units
    assert view.tokens == -3.0
    assert view.next_tokens_ms() == 1000 + 2000  # 4 tokens short, 2 per second
    assert view.next_tokens_ms(2.0) == 1000 + 2500


def test_a_key_in_force_with_no_state_is_full_and_a_key_with_nothing_left_is_trimmed() -> None:
    keys = shard_keys(1)
    got, asked = drive(
        rate_keys(keys),
        [[(b"fresh", 5.0), (b"gone", 4.0), (b"waited", 3.0), (b"kept", 2.0)], 4, 100_000],
        [
            *key_reads({}, b"10,60000,5,0"),  # in force, its hash expired once full
            *key_reads({}),  # nothing left: trimmed
            *key_reads({}, waiters=[b"waited\0t\x001\0j9"]),  # a waiter references it
            *key_reads({b"ta": b"3"}),  # its hash outlives its references
        ],
        [1, 0],
    )
    assert len(asked) == 3
    assert asked[2] == [
        Cmd("zrem", (keys[0].prefix + "rates", "gone")),
        Cmd("exists", (keys[0].prefix + "rate:gone",)),
    ]
    assert [v.key for v in got.keys] == ["fresh", "kept", "waited"]
    assert got.known == 3
    fresh = got.get("fresh")
    assert fresh is not None and fresh.tokens == 5.0
    kept = got.get("kept")
    assert kept is not None and (kept.rate, kept.tokens, kept.taken) == (None, None, 3.0)
    # a read that is told not to trim leaves the index alone
    _, asked = drive(rate_keys(keys, trim=False), [[(b"gone", 4.0)], 1, 100_000], key_reads({}))
    assert len(asked) == 2


def test_an_entry_whose_state_is_created_again_while_it_is_trimmed_is_put_back() -> None:
    keys = shard_keys(1)
    got, asked = drive(rate_keys(keys), [[(b"k", 4.0)], 1, 100_000], key_reads({}), [1, 1], [0])
    assert asked[3] == [Cmd("zadd", (keys[0].prefix + "rates", {"k": 100_000}), {"nx": True})]
    assert got.known == 1 and got.keys == []  # listed again by the next read


def test_the_dashboards_read_adds_keys_in_force_that_have_no_state_yet() -> None:
    keys = shard_keys(1)
    in_force = {b"rp:fresh": b"5,1000,5,0", b"rp:used": b"2,1000,2,0"}
    got, asked = drive(
        rate_keys(keys, in_force=True),
        [[(b"used", 1.0)], 1, 1000, in_force],
        [*key_reads({b"t": b"0", b"s": b"1000"}, b"2,1000,2,0"), *key_reads({}, b"5,1000,5,0")],
    )
    assert asked[0][3] == Cmd("hscan", (keys[0].prefix + "thr", "rp:*"))
    assert [(v.key, v.tokens) for v in got.keys] == [("fresh", 5.0), ("used", 0.0)]
    assert len(asked) == 2  # a key in force is never trimmed


def test_no_rate_key_costs_one_round_trip_and_the_read_is_bounded() -> None:
    keys = shard_keys(2)
    got, asked = drive(rate_keys(keys, limit=50), [[], 0, 7, [], 0, 9])
    assert got == RateKeys([], 0, 9) and len(asked) == 1
    assert asked[0][0] == Cmd("zrevrange", (keys[0].prefix + "rates", 0, 49), {"withscores": True})


def test_a_key_is_summed_over_the_shards_that_hold_it() -> None:
    got, _ = drive(
        rate_keys(shard_keys(2)),
        [[(b"m", 1.0)], 1, 1000, [(b"m", 2.0)], 1, 1000],
        [
            *key_reads(
                {b"t": b"1", b"s": b"1000", b"ta": b"5", b"pu": b"3000", b"pc": b"a", b"a": b"6"},
                b"4,1000,4,0",
                b"8,1",
                3000.0,
                [b"m\0x\x001\0j1"],
            ),
            *key_reads(
                {b"t": b"2", b"s": b"1000", b"ta": b"7", b"pu": b"5000", b"pc": b"b", b"a": b"3"},
                b"4,1000,4,0",
                b"8,1",
                2000.0,
                [b"m\0y\x001\0j2"],
            ),
        ],
    )
    (view,) = got.keys
    assert (view.tokens, view.taken, view.waiters, view.shards) == (3.0, 12.0, 2, 2)
    assert (view.paused_until_ms, view.pause_cause, view.due_ms) == (5000, "b", 2000)
    assert (view.adaptive, view.adaptive_limit, view.adaptive_bounds) == (3.0, 3, Adaptive(8, 1))


def test_in_force_fields_and_a_jobs_rate_fields_decode_leniently() -> None:
    assert parse_rate(b"90000,60000,10000,1") == Rate(90_000, 60.0, 10_000, "units")
    for bad in (None, b"", b"1,2,3", b"x,1000,1,0", b"0,1000,1,0", b"1,1000,1,0,9"):
        assert parse_rate(bad) is None
    assert parse_adaptive(b"40,2") == Adaptive(40, 2)
    assert parse_adaptive(b"2,40") is None and parse_adaptive(None) is None
    raw = {
        "rk": msgspec.msgpack.encode(
            [["model:gpt", 90_000, 60_000, 10_000, 1], ["user:a/1", 10, 1000, 10, 0], ["bad"]]
        ),
        "lim": msgspec.msgpack.encode([["model:gpt", 40, 1], ["db", 4]]),
        "rmu": b"6800",
        "pb": b"2",
    }
    job = decode_job_rates(raw)
    assert job.rates == {
        "model:gpt": Rate(90_000, 60.0, 10_000, "units"),
        "user:a/1": Rate(10, 1.0),
    }
    assert job.adaptive == {"model:gpt": Adaptive(40, 1)}
    assert (job.units, job.pushbacks) == (6.8, 2)
    assert (job.cost("model:gpt"), job.cost("user:a/1")) == (6.8, 1.0)
    assert decode_job_rates({"rk": b"\xc1", "lim": b"not msgpack"}) == JobRates()


# -- on a real server, written by the real scripts --------------------------------------


async def _view_of(app: App, key: str) -> RateKeyView | None:
    return (await app.store.view(rate_keys)).get(key)


@pytest.mark.anyio
async def test_jobs_waiting_for_tokens_are_the_keys_waiters_until_its_due_time(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task(rates={"model:slow": Rate(2, per=60.0)})
    async def call(n: int) -> int:
        return n

    async with app:
        jobs = [await call.enqueue(i, tenant="acme") for i in range(5)]
        async with running_worker(app, concurrency=5):
            assert [await j.result(timeout=WAIT) for j in jobs[:2]] == [0, 1]  # the burst

            async def three_wait() -> bool:
                view = await _view_of(app, "model:slow")
                return view is not None and view.waiters == 3

            await eventually(three_wait)
            view = await _view_of(app, "model:slow")
            now = await app.store.server_time_ms()
    assert view is not None
    assert view.rate == Rate(2, per=60.0) and view.taken == 2.0
    assert view.tokens is not None and 0.0 <= view.tokens < 1.0  # refilling: 1 per 30 s
    assert set(view.head) == {j.id for j in jobs[2:]}
    # the server's timer: when the first waiter's token is due, no sooner than now
    assert view.due_ms is not None and now < view.due_ms <= now + 30_000
    assert view.next_tokens_ms() == view.due_ms
    assert (view.paused, view.adaptive, view.pushbacks) == (False, None, 0)


@pytest.mark.anyio
@pytest.mark.contract
async def test_a_keys_counters_and_an_expired_state_trimmed_from_the_index(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task(rates={"model:x": Rate(20, per=1.0, burst=1)})  # a token each 50 ms
    async def call(n: int) -> int:
        return n

    async with app:
        jobs = [await call.enqueue(i, tenant="acme") for i in range(4)]
        async with running_worker(app, concurrency=4):
            for job in jobs:
                await job.result(timeout=WAIT)
        sync = create_sync_client(redis_url)
        try:
            seen = run_sync(sync, rate_keys([app.store.keys]))
        finally:
            sync.close()
        view = await _view_of(app, "model:x")
        assert view is not None and seen.get("model:x") is not None
        assert (view.taken, view.woken, view.waiters, view.due_ms) == (4.0, 3, 0, None)
        assert view.waited_ms > 0 and view.tokens is not None and view.tokens <= 1.0
        # no job references it now: its rate is no longer in force, its bucket is
        assert view.rate is None
        # once its state expires, the next read trims the index entry
        client, keys = app.store.client, app.store.keys
        await client.delete(keys.rate_state("model:x"))
        assert await _view_of(app, "model:x") is None
        assert await client.zcard(keys.rate_index) == 0
