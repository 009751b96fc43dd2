"""Lease upkeep (fairlane.runtime.lease) against a private server: renewals and sweeps.

The loops run on their own, with no worker: jobs are leased by calling the store's
exchange directly, and each test stops its loop from one of the loop's own callbacks
(or once what it waits for has happened), so what is checked is counts and order --
which leases were extended, lost, asked to cancel, reclaimed -- never how long it took.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Sequence

import pytest

from fairlane.config.settings import LeaseSettings
from fairlane.runtime.lease import renew_loop, sweep_loop, wait_or_stop
from fairlane.store.api import Store
from fairlane.store.wire import FetchedJob, NewJob
from tests.e2e.helpers import eventually

pytestmark = pytest.mark.anyio

LANE = "lease"
LONG = LeaseSettings(duration=60.0, renew_interval=10.0)


def _job(n: int, *, max_attempts: int = 3) -> NewJob:
    # no backoff, and every record kept: a reclaimed job stays where a test can see it
    return NewJob(
        f"j{n:04d}", "t", 0, "lease.job", "[]", max_attempts, "0,0,none", 0, "-1,-1", "-1,-1"
    )


async def _lease(
    store: Store, count: int, lease_ms: int, *, max_attempts: int = 3
) -> list[FetchedJob]:
    """Enqueue ``count`` jobs and lease them all to worker ``w1``."""
    await store.enqueue(LANE, [_job(n, max_attempts=max_attempts) for n in range(count)])
    fetched = await store.exchange("w1", [LANE], count, lease_ms, slots=count)
    assert len(fetched.jobs) == count
    return fetched.jobs


class Calls:
    """What a renewal loop told its caller, in order; ``stop`` ends it after a renewal."""

    def __init__(self, held: Sequence[tuple[str, str]], *, stop_after_held: int = 0) -> None:
        self.stop = asyncio.Event()
        self._held = list(held)
        self._stop_after_held = stop_after_held
        self.held_calls = 0
        self.renewed: list[float] = []
        self.lost: list[list[tuple[str, str]]] = []
        self.cancel: list[list[str]] = []

    def held(self) -> list[tuple[str, str]]:
        self.held_calls += 1
        if self.held_calls == self._stop_after_held:
            self.stop.set()
        return self._held

    def on_renewed(self, sent: float) -> None:
        self.renewed.append(sent)
        self.stop.set()  # one successful renewal, then the loop returns

    def on_lost(self, leases: list[tuple[str, str]]) -> None:
        self.lost.append(leases)

    def on_cancel(self, ids: list[str]) -> None:
        self.cancel.append(ids)


async def _renew(store: Store, calls: Calls, lease: LeaseSettings = LONG) -> None:
    await renew_loop(
        store=store,
        worker_id="w1",
        lease=lease,
        held=calls.held,
        on_lost=calls.on_lost,
        on_cancel=calls.on_cancel,
        stop=calls.stop,
        on_renewed=calls.on_renewed,
    )


async def _expiry(store: Store, job_id: str) -> float | None:
    """When the job's lease ends (server ms), None when no lease is held."""
    expiry: float | None = await store.client.zscore(store.keys.leases, job_id)
    return expiry


async def _expiries(store: Store, ids: Sequence[str]) -> list[float]:
    found = [await _expiry(store, job_id) for job_id in ids]
    held = [expiry for expiry in found if expiry is not None]
    assert len(held) == len(ids), f"leases not held: {found}"
    return held


# -- renewals --------------------------------------------------------------------------------


async def test_a_renewal_extends_every_held_lease_to_the_full_length(store: Store) -> None:
    jobs = await _lease(store, 3, lease_ms=30_000)
    before = await _expiries(store, [j.id for j in jobs])
    calls = Calls([(j.id, j.token) for j in jobs])
    await _renew(store, calls)
    now = await store.server_time_ms()
    after = await _expiries(store, [j.id for j in jobs])
    assert calls.held_calls == 1 and len(calls.renewed) == 1
    assert calls.lost == [] and calls.cancel == []
    for old, new in zip(before, after, strict=True):
        assert new > old and new >= now + 59_000


async def test_a_lost_lease_is_reported_with_the_token_it_was_sent_with(store: Store) -> None:
    jobs = await _lease(store, 2, lease_ms=30_000)
    kept, stale = jobs
    calls = Calls([(kept.id, kept.token), (stale.id, "not-its-token"), ("j9999", "7")])
    await _renew(store, calls)
    assert calls.lost == [[(stale.id, "not-its-token"), ("j9999", "7")]]
    # the lease that was not held by that token is left as it was
    assert (await _expiries(store, [stale.id]))[0] < (await _expiries(store, [kept.id]))[0]


async def test_a_cancel_request_reaches_the_worker_on_its_next_renewal(store: Store) -> None:
    jobs = await _lease(store, 3, lease_ms=30_000)
    await store.cancel(jobs[1].id)
    calls = Calls([(j.id, j.token) for j in jobs])
    await _renew(store, calls)
    assert calls.cancel == [[jobs[1].id]]
    assert calls.lost == []


async def test_renewals_keep_their_pace_through_an_outage_with_one_warning(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = Store.from_url(
        f"redis://127.0.0.1:{port}", namespace, socket_connect_timeout=0.5, socket_timeout=0.5
    )
    calls = Calls([("j0000", "1")], stop_after_held=3)
    caplog.set_level(logging.DEBUG, logger="fairlane.worker")
    try:
        await _renew(dead, calls, LeaseSettings(duration=0.2, renew_interval=0.01))
    finally:
        await dead.aclose()
    assert calls.held_calls == 3
    assert calls.renewed == [] and calls.lost == [] and calls.cancel == []
    about = [r for r in caplog.records if "renewing leases" in r.getMessage()]
    assert [r.levelno for r in about] == [logging.WARNING, logging.DEBUG, logging.DEBUG]


# -- sweeps ----------------------------------------------------------------------------------


def _sweeps(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("reclaimed")]


async def test_a_sweep_reclaims_in_passes_until_one_comes_back_short(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    jobs = await _lease(store, 25, lease_ms=1)
    await asyncio.sleep(0.05)  # every lease has ended by the server's clock
    caplog.set_level(logging.INFO, logger="fairlane.worker")
    lease = LeaseSettings(
        duration=60.0, renew_interval=10.0, sweep_interval=0.01, sweep_jitter=0, sweep_batch=10
    )
    done = asyncio.Event()

    async def reclaimed() -> bool:
        return len(_sweeps(caplog)) == 3

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(sweep_loop(store, lease, done))
        await eventually(reclaimed)
        done.set()
    assert _sweeps(caplog) == [
        "reclaimed 10 expired leases (0 dead-lettered)",
        "reclaimed 10 expired leases (0 dead-lettered)",
        "reclaimed 5 expired leases (0 dead-lettered)",
    ]
    assert [await _expiry(store, j.id) for j in jobs] == [None] * 25
    assert await store.dead_letters() == []
    # each counted as an attempt, and queued again
    again = await store.exchange("w2", [LANE], 25, 60_000, slots=25)
    assert sorted(j.id for j in again.jobs) == [j.id for j in jobs]
    assert {j.attempt for j in again.jobs} == {2}


async def test_a_sweep_dead_letters_a_job_out_of_attempts(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    jobs = await _lease(store, 2, lease_ms=1, max_attempts=1)
    await asyncio.sleep(0.05)
    caplog.set_level(logging.INFO, logger="fairlane.worker")
    lease = LeaseSettings(duration=60.0, renew_interval=10.0, sweep_interval=0.01, sweep_jitter=0)
    done = asyncio.Event()

    async def dead_lettered() -> bool:
        return len(await store.dead_letters()) == 2

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(sweep_loop(store, lease, done))
        await eventually(dead_lettered)
        done.set()
    assert _sweeps(caplog) == ["reclaimed 2 expired leases (2 dead-lettered)"]
    assert sorted(job_id for job_id, _ in await store.dead_letters()) == [j.id for j in jobs]


async def test_a_sweep_takes_a_worker_with_a_stale_heartbeat_out_of_capacity(
    store: Store,
) -> None:
    await store.exchange("gone", [LANE], 0, 60_000, slots=5)
    assert (await store.lane_state(LANE)).capacity == 5
    # stale after three lease lengths without a heartbeat: 30 ms here
    lease = LeaseSettings(duration=0.01, renew_interval=0.005, sweep_interval=0.01, sweep_jitter=0)
    done = asyncio.Event()

    async def dropped() -> bool:
        return (await store.lane_state(LANE)).capacity == 0

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(sweep_loop(store, lease, done))
        await eventually(dropped)
        done.set()


async def test_a_stopped_sweep_loop_sweeps_no_more(store: Store) -> None:
    await _lease(store, 1, lease_ms=1)
    done = asyncio.Event()
    done.set()
    # stopped before its first pass: the expired lease is left for another worker's sweep
    await sweep_loop(store, LeaseSettings(sweep_interval=0.01, sweep_jitter=0), done)
    assert await _expiry(store, "j0000") is not None


# -- waiting ---------------------------------------------------------------------------------


async def test_wait_or_stop_says_whether_it_was_stopped() -> None:
    stop = asyncio.Event()
    assert await wait_or_stop(stop, 0.01) is False
    stop.set()
    assert await wait_or_stop(stop, 60) is True
