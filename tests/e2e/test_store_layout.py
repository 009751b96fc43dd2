"""The store layout: job records leave out the fields at their defaults, and data of
another layout is refused with a message naming it, never misread.

A waiting job costs the server what its record holds, so a record carries only what
differs from its defaults (``fairlane.store.keys.JOB_FIELDS`` says what an absent field
reads as). Records written by an earlier library hold every field, and one of this
library's records read by an earlier one would be misread (an absent retention reads as
unbounded there), so each shard keeps the layout it was written in and an app refuses
to start on another.
"""

from __future__ import annotations

import pytest

from fairlane import App, Backoff, Retention
from fairlane.errors import StoreLayoutError
from fairlane.store.connection import create_sync_client
from fairlane.store.keys import STORE_LAYOUT, AppKeys
from tests.e2e.helpers import WAIT, make_app, running_workers

pytestmark = pytest.mark.anyio

#: the fields a plain job's record leaves out: each reads as its default
LEFT_OUT = {"x", "prio", "att", "sl", "bo", "rc", "rf", "ck"}
#: ...and, since layout 3, the default tenant, lane, budget, timeout and class, and the
#: time it may run while that is when it was enqueued
LEFT_OUT_SINCE_3 = {"tenant", "lane", "max", "to", "cls", "run"}


def _record(redis_url: str, app: App, job_id: str) -> dict[str, str]:
    client = create_sync_client(redis_url, socket_timeout=10, socket_connect_timeout=10)
    try:
        raw = client.hgetall(app.store.keys.job(job_id))
    finally:
        client.close()
    return {k.decode(): v.decode() for k, v in raw.items()}


def _layout(redis_url: str, namespace: str) -> bytes | None:
    """The store layout the app's shard records (its stats hash's ``layout``)."""
    client = create_sync_client(redis_url, socket_timeout=10, socket_connect_timeout=10)
    try:
        return client.hget(AppKeys.for_app(namespace).stats, "layout")
    finally:
        client.close()


async def test_a_plain_record_leaves_its_defaults_out_and_runs_as_before(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task
    async def echo(a: int, b: str) -> str:
        return f"{a}{b}"

    @app.task(
        attempts=2,
        backoff=Backoff(base=0.01, cap=0.01, jitter="none"),
        retention=Retention(completed=5, failed=5),
        timeout=7,
    )
    async def unusual(a: int) -> int:
        return a

    async with app:
        plain = await echo.enqueue(1, "x")
        assert (LEFT_OUT | LEFT_OUT_SINCE_3).isdisjoint(_record(redis_url, app, plain.id))
        other = await unusual.enqueue(2, priority=3, tenant="acme", service_class="batch")
        later = await echo.enqueue(2, "y", delay=0.05)
        held = _record(redis_url, app, other.id)
        # what differs from the defaults stays in the record, the rest reads as usual
        assert (held["tenant"], held["max"], held["to"], held["cls"]) == ("acme", "2", "7", "batch")
        waiting = _record(redis_url, app, later.id)
        assert int(waiting["run"]) > int(waiting["enq"])
        assert held["prio"] == "3"
        assert held["bo"] == Backoff(base=0.01, cap=0.01, jitter="none").encode()
        assert (held["rc"], held["rf"]) == ("5,-1", "5,-1")
        async with running_workers(app):
            assert await plain.result(timeout=WAIT) == "1x"
            assert await other.result(timeout=WAIT) == 2
            assert await later.result(timeout=WAIT) == "2y"
        info = await plain.info()
        assert (info.attempts, info.max_attempts, info.slots) == (1, 3, 1)
        assert (info.tenant, info.service_class) == ("default", "standard")
        assert info.not_before == info.enqueued_at is not None
        # kept by the default retention (the record named none)
        client = create_sync_client(redis_url, socket_timeout=10, socket_connect_timeout=10)
        try:
            assert client.zscore(app.store.keys.kept(echo.name, "ok"), plain.id) is not None
        finally:
            client.close()


async def test_a_shard_keeps_the_layout_it_was_written_in(redis_url: str, namespace: str) -> None:
    async with make_app(namespace, redis_url):
        pass
    assert _layout(redis_url, namespace) == str(STORE_LAYOUT).encode()
    async with make_app(namespace, redis_url):  # the same layout: it starts
        pass


@pytest.mark.parametrize(
    ("layout", "who"),
    [
        (None, "an earlier"),
        ("2", "an earlier"),
        (str(STORE_LAYOUT - 1), "an earlier"),
        (str(STORE_LAYOUT + 1), "a later"),
    ],
)
async def test_data_of_another_layout_is_refused_by_name(
    redis_url: str, namespace: str, layout: str | None, who: str
) -> None:
    stats = AppKeys.for_app(namespace).stats
    client = create_sync_client(redis_url, socket_timeout=10, socket_connect_timeout=10)
    try:
        # an earlier library wrote no layout, only its counters
        client.hset(stats, "seq", "41")
        if layout is not None:
            client.hset(stats, "layout", layout)
        with pytest.raises(StoreLayoutError) as refused:
            async with make_app(namespace, redis_url):
                pass
        found = int(layout) if layout else 1
        assert refused.value.found == found
        text = str(refused.value)
        assert f"{who} Fairlane (store layout {found})" in text
        assert f"reads store layout {STORE_LAYOUT} only" in text
        # nothing was written over it
        assert client.hget(stats, "layout") == (layout.encode() if layout else None)
        # connected without declaring, the app's keys are purged whatever wrote them
        # (fairlane purge), and the app then starts afresh in this layout
        app = make_app(namespace, redis_url)
        await app.connect(declare=False)
        try:
            assert await app.purge() >= 1
        finally:
            await app.aclose()
        assert client.exists(stats) == 0
        async with make_app(namespace, redis_url):
            pass
        assert client.hget(stats, "layout") == str(STORE_LAYOUT).encode()
    finally:
        client.close()


async def test_a_shard_this_library_wrote_before_declaring_is_claimed(
    redis_url: str, namespace: str
) -> None:
    # as after a restart that lost the data: a producer stores a job on the shard before
    # any app declares itself there again; its counters are no sign of an earlier library
    app = make_app(namespace, redis_url)

    @app.task
    async def echo(n: int) -> int:
        return n

    await app.connect(declare=False)
    try:
        await echo.enqueue(1)
    finally:
        await app.aclose()
    async with make_app(namespace, redis_url):
        pass
    assert _layout(redis_url, namespace) == str(STORE_LAYOUT).encode()
